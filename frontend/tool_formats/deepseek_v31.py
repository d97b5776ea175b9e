"""DeepSeek-V3.1 calls: the DeepSeek-V3 tokens (`deepseek_v3`), no fence, the name
before the separator::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "CET"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
"""  # noqa: E501

from __future__ import annotations

from .deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from .marked_calls import CallSyntax, JsonArgumentsFormat, MarkedCallParser, Template

SYNTAX = CallSyntax(
    call_begin=CALL_BEGIN,
    call_end=CALL_END,
    header=Template(f"{{name}}{SEP}"),
    section=(CALLS_BEGIN, CALLS_END),
)


class DeepSeekV31Parser(MarkedCallParser):
    syntax = SYNTAX


class DeepSeekV31ToolFormat(JsonArgumentsFormat):
    special_markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
    syntax = SYNTAX
    marker_covers = ("｜",)
    parser_class = DeepSeekV31Parser
