"""Llama 3.x JSON calls::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"tz": "CET"}}

Constraint: an optional ``<|python_tag|>`` (Llama 3.1's JSON tool calling writes
none), then `CALLS`: call objects separated by ``"; "``, ONE JSON schema over all
offered tools (`call_objects.call_object_schema`).

Parser (`CALLS` too): calls are recognised only at the start of the output (after
whitespace), with or without ``<|python_tag|>``; ``parameters`` or ``arguments`` is
accepted; objects are separated by ``;`` or by whitespace alone (one call per line).
Reading stops at the first object that is not a call (an unknown name, arguments
that are not a complete JSON object): that object and everything after it is
content. An output that does not open with a call is all content, its tag included.
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Sequence

from structured_output import GrammarSpec

from .base import FunctionTool, Markup, ToolCallParser, ToolFormat
from .call_objects import JSON_NAME_SYNTAX, CallList, CallObjectsParser, json_name_ok
from .grammar import FreeText, optional, select_tools, seq, structural_tag, token
from .json_text import Incomplete
from .scanning import MarkerSet

PYTHON_TAG = "<|python_tag|>"
CALLS = CallList(args_key="parameters", separator="; ", bare_separator=True)


class Llama3JsonToolFormat(ToolFormat):
    special_markers = (PYTHON_TAG,)

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, json_name_ok, JSON_NAME_SYNTAX)
        free = FreeText.build(self.tokenizer, self.special_markers)
        calls = CALLS.grammar(chosen, free, many=parallel and named is None)
        return structural_tag(seq(optional(token(PYTHON_TAG)), calls))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None, forced: bool = False
    ) -> ToolCallParser:
        return Llama3JsonParser(self, tools, named=named, forced=forced)

    @property
    def markup(self) -> Markup:
        return Markup((PYTHON_TAG, *CALLS.markup), CALLS.separator)


class Llama3JsonParser(CallObjectsParser):
    _tag = MarkerSet([PYTHON_TAG])

    def _start(self) -> bool:
        """Decide, without consuming anything, whether the output opens with a call."""
        buf = self._buf
        start = pos = self._pos
        while pos < len(buf) and buf[pos].isspace():
            pos += 1
        if buf.startswith(PYTHON_TAG, pos):
            pos += len(PYTHON_TAG)
        elif not self._final and (pos == len(buf) or self._tag.may_start(buf, pos)):
            return False
        try:
            at = self._objects_ahead(CALLS, pos)
        except Incomplete:
            return False
        if at is None:
            self._state = self._rest_is_content
            return True
        self._read_objects(CALLS, start=start, at=at, cut=self._tag, then=self._rest_is_content)
        return True
