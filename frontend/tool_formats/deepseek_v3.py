"""DeepSeek-V3 / R1 calls, five special tokens and a fenced JSON block::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time
    ```json
    {"tz": "CET"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Constraint: one section holding the calls, ``\\n`` between calls. Parser:
whitespace around the fence is free; a call without its closing fence or end marker
ends where its JSON ends.
"""

from __future__ import annotations

from .marked_calls import CallSyntax, JsonArgumentsFormat, MarkedCallParser, Template

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
SYNTAX = CallSyntax(
    call_begin=CALL_BEGIN,
    call_end=CALL_END,
    header=Template(f"function{SEP}{{name}}\n```json\n"),
    section=(CALLS_BEGIN, CALLS_END),
    tail=("\n```",),
    separator="\n",
)


class DeepSeekV3Parser(MarkedCallParser):
    syntax = SYNTAX


class DeepSeekV3ToolFormat(JsonArgumentsFormat):
    special_markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
    syntax = SYNTAX
    #: every DeepSeek marker holds the fullwidth bar
    marker_covers = ("｜",)
    parser_class = DeepSeekV3Parser
