"""Mistral calls; call ids are 9 letters and digits, as in Mistral's own API::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}

Older models write one array instead, which the parser reads too::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]

A call ends where its JSON ends; text after it is content. The constraint writes the
newer form.
"""

from __future__ import annotations

import secrets
import string

from .call_objects import CallObjectsParser
from .marked_calls import CallSyntax, JsonArgumentsFormat, MarkedCallParser, Template

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
SYNTAX = CallSyntax(call_begin=TOOL_CALLS, call_end=None, header=Template(f"{{name}}{ARGS}"))
_ID_ALPHABET = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    """9 random letters and digits."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


class MistralParser(MarkedCallParser, CallObjectsParser):
    syntax = SYNTAX

    def new_call_id(self, index: int, name: str) -> str:
        return mistral_call_id()

    def _header(self) -> bool:
        buf, pos = self._buf, self._pos
        while pos < len(buf) and buf[pos].isspace():
            pos += 1
        if pos < len(buf) and buf[pos] == "[" and not buf.startswith(TOOL_CALLS, pos):
            if not self._final and TOOL_CALLS.startswith(buf[pos : pos + len(TOOL_CALLS)]):
                return False  # "[" may begin another [TOOL_CALLS]
            self._pos = pos + 1
            self._read_objects(separator=",", closer="]", cut=self._cut, then=self._outside)
            return True
        return super()._header()


class MistralToolFormat(JsonArgumentsFormat):
    special_markers = (TOOL_CALLS, ARGS)
    syntax = SYNTAX
    #: "S]" ends both markers (and Mistral's other bracketed control tokens)
    marker_covers = ("S]",)
    parser_class = MistralParser
