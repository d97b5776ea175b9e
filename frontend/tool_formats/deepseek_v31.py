"""DeepSeek-V3.1 calls: the DeepSeek-V3 tokens (`deepseek_v3`), no fence, the name
before the separator::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "CET"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

`SYNTAX` is the one description. Parser: whitespace is free around every marker and
the name; a call counts once its JSON object is complete, so its end marker may be
missing. Content: a call whose name is no tool of the request, or whose arguments
are cut short or not an object.
"""  # noqa: E501

from __future__ import annotations

from .deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from .marked_calls import CallSyntax, JsonArgumentsFormat, Template

SYNTAX = CallSyntax(
    call_begin=CALL_BEGIN,
    call_end=CALL_END,
    header=Template(f"{{name}}{SEP}"),
    section=(CALLS_BEGIN, CALLS_END),
)


class DeepSeekV31ToolFormat(JsonArgumentsFormat):
    special_markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
    syntax = SYNTAX
    marker_covers = ("｜",)
