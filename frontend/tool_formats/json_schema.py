"""Forcing a call with a JSON schema instead of the family's syntax (FORMATS.md,
"Forcing a call", item 2); the output is plain JSON, the same for every family.

- "required": `CALLS`, a JSON array of ``{"name": NAME, "parameters": ARGS}``
  objects (one schema for all tools), one object only without parallel calls;
- a named function: just its parameter schema; the name comes from the request
  (``named`` of `JsonSchemaToolFormat.new_parser`).

Both are compiled as a structural tag, for the bounded whitespace and the special
tokens kept out of strings that a structural tag gives.

Parser: "required" reads `CALLS` (objects need ``"name"`` first, then
``"parameters"`` or ``"arguments"``); reading stops at the first object that is not
a call, which is content with everything after it (from the ``[`` on, if it is the
first). An output that does not open such an array is all content. Named: a JSON
object first is the call's arguments, text after it content; an output that does
not open with ``{``, or whose object is cut short, is all content.
"""

from __future__ import annotations

from collections.abc import Sequence

from structured_output import GrammarSpec

from .base import FunctionTool, Markup, ToolCallParser, ToolFormat
from .call_objects import JSON_NAME_SYNTAX, CallList, CallObjectsParser, json_name_ok
from .grammar import FreeText, json_value, select_tools, structural_tag
from .json_text import Incomplete
from .scanning import MarkerSet

CALLS = CallList(args_key="parameters", opening="[", separator=", ", closing="]")


class JsonSchemaToolFormat(ToolFormat):
    """Not a family: available for every tokenizer."""

    name = "json_schema"

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, json_name_ok, JSON_NAME_SYNTAX)
        free = FreeText.build(self.tokenizer, ())
        if named is not None:
            return structural_tag(json_value(chosen[0].schema, free))
        return structural_tag(CALLS.grammar(chosen, free, many=parallel))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None, forced: bool = False
    ) -> ToolCallParser:
        return JsonSchemaParser(self, tools, named=named, forced=forced)

    @property
    def markup(self) -> Markup:
        return Markup(CALLS.markup, CALLS.separator)


class JsonSchemaParser(CallObjectsParser):
    _no_markers = MarkerSet(())

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
            self._begin_call(self._pos)
            if not self._name_call(self.named):
                self._fail_call()
                return self._not_calls()
            self._pos = i
            self._state = self._named_arguments
            return True
        try:
            at = self._objects_ahead(CALLS, i)
        except Incomplete:
            return False
        if at is None:
            return self._not_calls()
        self._read_objects(
            CALLS, start=self._pos, at=at, cut=self._no_markers, then=self._rest_is_content
        )
        return True

    def _undecided(self) -> bool:
        return self._not_calls() if self._final else False

    def _not_calls(self) -> bool:
        self._state = self._rest_is_content
        return True

    def _named_arguments(self) -> bool:
        pos = self._pos
        ended = self._read_json(self._no_markers)
        if ended is None:
            return self._pos != pos
        if not ended:
            self._fail_call()
        elif self._end_call():
            self._state = self._rest_is_content
            return True
        return self._not_calls()
