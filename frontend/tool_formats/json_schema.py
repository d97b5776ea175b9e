"""Forcing a call with a JSON schema instead of the family's syntax (FORMATS.md,
"Forcing a call", item 2); the output is plain JSON, the same for every family.

- "required": an array (``minItems`` 1; ``maxItems`` 1 without parallel calls) of
  ``{"name": NAME, "parameters": ARGS}`` objects, one schema for all tools;
- a named function: just its parameter schema; the name comes from the request
  (``named`` of `JsonSchemaToolFormat.new_parser`).

The schema is compiled as a structural tag around it, for the bounded whitespace and
the special tokens kept out of strings that a structural tag gives.

Parser: "required" reads the array (objects need ``"name"`` first, then
``"parameters"`` or ``"arguments"``); text after the array is content, and an
output that is not such an array is all content. Named: a JSON object first is the
call's arguments, text after it content; an output that does not open with ``{`` is
all content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from structured_output import GrammarSpec

from .base import FunctionTool, ToolCallParser, ToolFormat
from .call_objects import (
    JSON_NAME_SYNTAX,
    CallObjectsParser,
    call_object_schema,
    json_name_ok,
    read_object_header,
)
from .grammar import FreeText, json_value, select_tools, structural_tag
from .json_text import Incomplete, NoMatch
from .scanning import Markers

ARGS_KEY = "parameters"


def calls_schema(tools: Sequence[FunctionTool], *, parallel: bool) -> dict[str, Any]:
    """The "required" schema: an array of call objects."""
    item = call_object_schema(tools, ARGS_KEY)
    defs = item.pop("$defs", None)
    schema: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


class JsonSchemaToolFormat(ToolFormat):
    """Not a family: available for every tokenizer."""

    name = "json_schema"

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, json_name_ok, JSON_NAME_SYNTAX)
        free = FreeText.build(self.tokenizer, ())
        schema = chosen[0].schema if named is not None else calls_schema(chosen, parallel=parallel)
        return structural_tag(json_value(schema, free))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None
    ) -> ToolCallParser:
        return JsonSchemaParser(self, tools, named=named)


class JsonSchemaParser(CallObjectsParser):
    _no_markers = Markers(())

    def _start(self) -> bool:
        """Decide, without consuming anything, whether the output is calls."""
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i].isspace():
            i += 1
        if i == len(buf):
            return self._undecided()
        if self.named is not None:
            if buf[i] != "{":
                return self._not_calls()
            self._open_call(self.named)
            self._pos = i
            self._state = self._named_arguments
            return True
        if buf[i] != "[":
            return self._not_calls()
        try:
            self._header_at(read_object_header, i + 1)
        except Incomplete:
            return False
        except NoMatch:
            return self._not_calls()
        self._pos = i + 1
        self._read_objects(
            separator=",", closer="]", cut=self._no_markers, then=self._rest_is_content
        )
        return True

    def _undecided(self) -> bool:
        return self._not_calls() if self._final else False

    def _not_calls(self) -> bool:
        self._state = self._rest_is_content
        return True

    def _named_arguments(self) -> bool:
        pos = self._pos
        ended = self._stream_json(self._no_markers)
        if ended is None:
            return self._pos != pos
        self._close_call()
        self._state = self._rest_is_content
        return True
