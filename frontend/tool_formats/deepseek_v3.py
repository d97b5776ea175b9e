"""DeepSeek-V3 / R1 calls, five special tokens and a fenced JSON block::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time
    ```json
    {"tz": "CET"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

`SYNTAX` is the one description. Constraint: one section holding the calls, ``\\n``
between calls. Parser (`marked_calls.MarkedCallParser`): whitespace is free around
the markers, the name and the fence, and the fence's newlines may be missing
(``get_weather```json{...}```); a name whose line breaks without the fence goes
straight on to the JSON; a call counts once its JSON object is complete, so its
closing fence and end marker may be missing.
"""

from __future__ import annotations

from .marked_calls import CallSyntax, JsonArgumentsFormat, Template

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
SYNTAX = CallSyntax(
    call_begin=CALL_BEGIN,
    call_end=CALL_END,
    header=Template(f"function{SEP}{{name}}\n```json\n", markers=(SEP,)),
    section=(CALLS_BEGIN, CALLS_END),
    tail=("\n```",),
    separator="\n",
)


class DeepSeekV3ToolFormat(JsonArgumentsFormat):
    special_markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
    syntax = SYNTAX
    #: every DeepSeek marker holds the fullwidth bar
    marker_covers = ("｜",)
