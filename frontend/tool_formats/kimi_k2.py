"""Kimi-K2 calls; the call id is the model's own ``functions.NAME:N``::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|><|tool_calls_section_end|>

`SYNTAX` is the one description. The constraint lets N be any index up to four
digits (the model counts calls across the conversation, which the grammar cannot
know).

Parser: whitespace is free around every marker and around ``NAME`` and ``N`` in the
call id (section markers are never content); a call counts once its JSON object is
complete, so its ``<|tool_call_end|>`` may be missing. Content: a call whose id does
not read as ``functions.NAME:N`` with NAME a tool of the request, or whose arguments
are cut short or not an object.
"""  # noqa: E501

from __future__ import annotations

from .marked_calls import CallSyntax, JsonArgumentsFormat, MarkedCallParser, Template

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
ID_PREFIX = "functions."
SYNTAX = CallSyntax(
    call_begin=CALL_BEGIN,
    call_end=CALL_END,
    header=Template(f"{ID_PREFIX}{{name}}:{{index}}{ARGUMENT_BEGIN}"),
    section=(SECTION_BEGIN, SECTION_END),
)


class KimiK2Parser(MarkedCallParser):
    def read_header(self, text: str, i: int) -> tuple[int, str, str | None]:
        end, fields = SYNTAX.header.read(text, i)  # type: ignore[union-attr]
        name = fields["name"]
        return end, name, f"{ID_PREFIX}{name}:{fields['index']}"


class KimiK2ToolFormat(JsonArgumentsFormat):
    special_markers = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END)
    syntax = SYNTAX
    #: every Kimi marker opens with "<|"
    marker_covers = ("<|",)
    parser_class = KimiK2Parser
