"""Llama 3.x JSON calls::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"tz": "CET"}}

Calls are recognised only at the start of the output (after whitespace), with or
without ``<|python_tag|>``; ``parameters`` or ``arguments`` is accepted. An output
that does not start with a call object is all content; text after the last call is
content.

Constraint: an optional ``<|python_tag|>`` (Llama 3.1's JSON tool calling writes
none), then call objects separated by ``"; "``. The objects are ONE JSON schema over all
offered tools (`call_objects.call_object_schema`).
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Sequence

from structured_output import GrammarSpec

from .base import FunctionTool, ToolCallParser, ToolFormat
from .call_objects import (
    JSON_NAME_SYNTAX,
    CallObjectsParser,
    call_object_schema,
    json_name_ok,
    read_object_header,
)
from .grammar import (
    FreeText,
    const,
    json_value,
    optional,
    repeated,
    select_tools,
    seq,
    structural_tag,
    token,
)
from .json_text import Incomplete, NoMatch
from .scanning import Markers

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"
#: what the constraint writes between calls
WRITTEN_SEPARATOR = "; "
ARGS_KEY = "parameters"


class Llama3JsonToolFormat(ToolFormat):
    special_markers = (PYTHON_TAG,)

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, json_name_ok, JSON_NAME_SYNTAX)
        free = FreeText.build(self.tokenizer, self.special_markers)
        call = json_value(call_object_schema(chosen, ARGS_KEY), free)
        many = parallel and named is None
        calls = repeated(call, separator=const(WRITTEN_SEPARATOR), parallel=many)
        return structural_tag(seq(optional(token(PYTHON_TAG)), calls))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None
    ) -> ToolCallParser:
        return Llama3JsonParser(self, tools, named=named)


class Llama3JsonParser(CallObjectsParser):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._tag = Markers([PYTHON_TAG])

    def _start(self) -> bool:
        """Decide, without consuming anything, whether the output opens with a call."""
        buf = self._buf
        pos = self._pos
        while pos < len(buf) and buf[pos].isspace():
            pos += 1
        if buf.startswith(PYTHON_TAG, pos):
            pos += len(PYTHON_TAG)
        elif not self._final and (pos == len(buf) or self._tag.may_start(buf, pos)):
            return False
        try:
            self._header_at(read_object_header, pos)
        except Incomplete:
            return False
        except NoMatch:
            self._state = self._rest_is_content
            return True
        self._pos = pos
        self._read_objects(
            separator=SEPARATOR, closer=None, cut=self._tag, then=self._rest_is_content
        )
        return True
