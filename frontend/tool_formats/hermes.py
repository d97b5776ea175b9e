"""Hermes-style calls (Qwen2.5, Qwen3 and many fine-tunes)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"tz": "CET"}}
    </tool_call>

``<tool_call>`` and ``</tool_call>`` are single special tokens.

Constraint: each call is ``<tool_call>`` ``\\n`` one JSON object ``\\n``
``</tool_call>``, calls separated by ``\\n``. The object is ONE JSON schema over all
offered tools (``anyOf`` of ``{"name": {"const": NAME}, "arguments": PARAMETERS}``,
name first, no other keys), so the compile cost of keeping markers out of its
strings is paid once, not once per tool.

Parser: the object's ``"name"`` must come before ``"arguments"`` (or
``"parameters"``); whitespace anywhere between JSON tokens; an unterminated last call
is accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

from structured_output import GrammarSpec

from .base import FunctionTool, ToolCallParser, ToolFormat
from .call_objects import JSON_NAME_SYNTAX, call_object_schema, json_name_ok, read_object_header
from .grammar import (
    FreeText,
    const,
    json_value,
    repeated,
    select_tools,
    seq,
    structural_tag,
    token,
)
from .marked_calls import CallSyntax, MarkedCallParser

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"
SYNTAX = CallSyntax(call_begin=CALL_BEGIN, call_end=CALL_END, tail=("}",))
#: keeps both markers out of the arguments' strings (a substring of each, shorter
#: and so cheaper to compile than the markers themselves)
MARKER_COVER = "_call>"


class HermesToolFormat(ToolFormat):
    special_markers = (CALL_BEGIN, CALL_END)

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, json_name_ok, JSON_NAME_SYNTAX)
        free = FreeText.build(self.tokenizer, SYNTAX.markers, [MARKER_COVER])
        call = seq(
            token(CALL_BEGIN),
            const("\n"),
            json_value(call_object_schema(chosen, "arguments"), free),
            const("\n"),
            token(CALL_END),
        )
        return structural_tag(
            repeated(call, separator=const("\n"), parallel=parallel and named is None)
        )

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None
    ) -> ToolCallParser:
        return HermesParser(self, tools, named=named)


class HermesParser(MarkedCallParser):
    syntax = SYNTAX

    def read_header(self, text: str, i: int) -> tuple[int, str, str | None]:
        end, name = read_object_header(text, i)
        return end, name, None
