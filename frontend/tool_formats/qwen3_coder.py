"""Qwen3-Coder calls (also known as qwen3_xml)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

``<tool_call>``/``</tool_call>`` are special tokens; the rest is text. Parameter
values are raw text converted by the tool's schema (`xml_params`); the newline on
each side of a value belongs to the markup.

Constraint: calls separated by ``\\n``; in each, the tool's parameters in schema
order, required ones always, each value in the form `xml_params.value_kind` gives.

Parser: whitespace between tags is free; a missing ``</parameter>`` ends the value
at the call's end.
"""

from __future__ import annotations

from collections.abc import Sequence

from structured_output import GrammarSpec

from .base import FunctionTool, ToolCallParser, ToolFormat
from .grammar import (
    API_NAME_SYNTAX,
    FreeText,
    api_name_ok,
    select_tools,
    structural_tag,
    vocabulary_covers,
)
from .marked_calls import CallSyntax, Template, call_format, calls_format
from .xml_params import ParamSyntax, XmlParamsParser, check_keys, params_format

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"
SYNTAX = CallSyntax(
    call_begin=CALL_BEGIN,
    call_end=CALL_END,
    header=Template("\n<function={name}>\n"),
    tail=("</function>\n",),
    separator="\n",
)
PARAMS = ParamSyntax(
    key_begin="<parameter=", key_end=">", value_end="</parameter>", newline_wrapped=True
)
#: markers a raw value may not hold (the parser ends a value at any of them)
VALUE_STOPS = (PARAMS.value_end, *SYNTAX.markers)
#: keeps both call markers out of strings nested in JSON values (a substring of each)
CALL_MARKER_COVER = "_call>"


class Qwen3CoderToolFormat(ToolFormat):
    special_markers = (CALL_BEGIN, CALL_END)

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, api_name_ok, API_NAME_SYNTAX)
        free = FreeText.build(self.tokenizer, SYNTAX.markers, [CALL_MARKER_COVER])
        raw = [*VALUE_STOPS, *vocabulary_covers(self.tokenizer)]
        markers = self.special_markers
        calls = []
        for t in chosen:
            check_keys(self.name, t.schema, "<>\n")
            args = params_format(t.schema, PARAMS, markers, free, raw)
            calls.append(call_format(SYNTAX, markers, t.name, args))
        many = parallel and named is None
        return structural_tag(calls_format(SYNTAX, markers, calls, many=many))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None
    ) -> ToolCallParser:
        return Qwen3CoderParser(self, tools, named=named)


class Qwen3CoderParser(XmlParamsParser):
    syntax = SYNTAX
    params = PARAMS
