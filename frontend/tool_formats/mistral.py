"""Mistral calls; call ids are 9 letters and digits, as in Mistral's own API::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}

Older models write one array instead, which the parser reads too::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]

`SYNTAX` is the one description of the newer form, which the constraint writes.
The parser reads both (the older one as `LEGACY`, a `CallList`), with whitespace free
around the markers and the name; a call ends where its JSON ends, and text after it
is content. Content: a call whose name is no tool of the request, or whose arguments
are cut short or not an object; in the array, the first object that is not a call
and everything after it.
"""

from __future__ import annotations

import secrets
import string

from .base import Markup
from .call_objects import CallList, CallObjectsParser
from .json_text import Incomplete
from .marked_calls import CallSyntax, JsonArgumentsFormat, MarkedCallParser, Template

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
SYNTAX = CallSyntax(call_begin=TOOL_CALLS, call_end=None, header=Template(f"{{name}}{ARGS}"))
#: the older form's array, after ``[TOOL_CALLS]``
LEGACY = CallList(args_key="arguments", opening="[", separator=", ", closing="]")
_ID_ALPHABET = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    """9 random letters and digits."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


class MistralParser(MarkedCallParser, CallObjectsParser):
    def new_call_id(self, index: int, name: str) -> str:
        return mistral_call_id()

    def _header(self) -> bool:
        buf, pos = self._buf, self._pos
        while pos < len(buf) and buf[pos].isspace():
            pos += 1
        if buf.startswith(LEGACY.opening, pos) and not buf.startswith(TOOL_CALLS, pos):
            if not self._final and TOOL_CALLS.startswith(buf[pos : pos + len(TOOL_CALLS)]):
                return False  # "[" may begin another [TOOL_CALLS]
            try:
                at = self._objects_ahead(LEGACY, pos)
            except Incomplete:
                return False
            if at is not None:
                self._read_objects(
                    LEGACY, start=self._pos, at=at, cut=self._cut, then=self._outside
                )
                return True
        return super()._header()


class MistralToolFormat(JsonArgumentsFormat):
    special_markers = (TOOL_CALLS, ARGS)
    syntax = SYNTAX
    #: "S]" ends both markers (and Mistral's other bracketed control tokens)
    marker_covers = ("S]",)
    parser_class = MistralParser

    @property
    def markup(self) -> Markup:
        return Markup((*SYNTAX.markup, *LEGACY.markup), SYNTAX.separator)
