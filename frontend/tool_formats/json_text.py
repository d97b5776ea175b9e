"""JSON text read incrementally: where a value ends, and the small headers that
JSON-object call syntaxes start with (``{"name": "f", "arguments": ``)."""

from __future__ import annotations

import json
import re
from typing import Any

_STRUCTURE = re.compile(r'["{}\[\]]')
_IN_STRING = re.compile(r'["\\]')
_SCALAR_END = re.compile(r"[\s,}\]]")
_JSON_WS = " \t\n\r"


class JsonExtent:
    """Finds where one JSON value ends in text that arrives in pieces.

    It tracks strings, escapes and bracket depth only; it does not validate. A value
    is a container (ends where its brackets balance), a string (ends at its closing
    quote) or a scalar (ends before whitespace, ``,``, ``}`` or ``]``).
    """

    __slots__ = ("started", "done", "_depth", "_string", "_escape", "_scalar")

    def __init__(self) -> None:
        self.started = False
        self.done = False
        self._depth = 0
        self._string = False
        self._escape = False
        self._scalar = False

    def feed(self, text: str, pos: int, end: int) -> tuple[int, int]:
        """Read ``text[pos:end]``; return ``(start, stop)``: the value's text in this
        span is ``text[start:stop]`` (whitespace before the value is skipped), and
        ``stop`` is where reading ended (just past the value once `done`)."""
        i = start = pos
        if not self.started:
            while i < end and text[i] in _JSON_WS:
                i += 1
            if i == end:
                return i, i
            self.started = True
            start = i
            c = text[i]
            if c in "{[":
                self._depth = 1
                i += 1
            elif c == '"':
                self._string = True
                i += 1
            else:
                self._scalar = True
        while i < end and not self.done:
            if self._escape:
                self._escape = False
                i += 1
            elif self._string:
                m = _IN_STRING.search(text, i, end)
                if m is None:
                    i = end
                elif m.group() == "\\":
                    self._escape = True
                    i = m.end()
                else:
                    i = m.end()
                    self._string = False
                    self.done = self._depth == 0
            elif self._scalar:
                m = _SCALAR_END.search(text, i, end)
                if m is None:
                    i = end
                else:
                    i = m.start()
                    self.done = True
            else:
                m = _STRUCTURE.search(text, i, end)
                if m is None:
                    i = end
                    continue
                i = m.end()
                c = m.group()
                if c == '"':
                    self._string = True
                elif c in "{[":
                    self._depth += 1
                else:
                    self._depth -= 1
                    self.done = self._depth == 0
        return start, i


class Incomplete(Exception):
    """The text ends before the construct could be decided."""


class NoMatch(Exception):
    """The text is not the construct."""


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _JSON_WS:
        i += 1
    return i


def expect(text: str, i: int, literal: str) -> int:
    """``literal`` at ``i`` (after optional whitespace); the index past it."""
    i = skip_ws(text, i)
    piece = text[i : i + len(literal)]
    if piece == literal:
        return i + len(literal)
    if literal.startswith(piece):
        raise Incomplete
    raise NoMatch


def read_string(text: str, i: int) -> tuple[int, str]:
    """A JSON string at ``i`` (after optional whitespace): the index past it and its value."""
    i = skip_ws(text, i)
    if i == len(text):
        raise Incomplete
    if text[i] != '"':
        raise NoMatch
    j = i + 1
    while True:
        m = _IN_STRING.search(text, j)
        if m is None:
            raise Incomplete
        if m.group() == '"':
            break
        if m.end() == len(text):
            raise Incomplete
        j = m.end() + 1
    try:
        return m.end(), json.loads(text[i : m.end()])
    except ValueError:
        raise NoMatch from None


def read_call_header(text: str, i: int, args_keys: tuple[str, ...]) -> tuple[int, str]:
    """``{"name": "NAME", "<args key>": `` at ``i``: the index where the arguments
    value begins and the name. The name must come first (as every template writes it)."""
    i = expect(text, i, "{")
    i, key = read_string(text, i)
    if key != "name":
        raise NoMatch
    i = expect(text, i, ":")
    i, name = read_string(text, i)
    if not name:
        raise NoMatch
    i = expect(text, i, ",")
    i, key = read_string(text, i)
    if key not in args_keys:
        raise NoMatch
    return expect(text, i, ":"), name


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _number(text: str) -> int:
    return 0


def _strict(text: str) -> Any:
    """``text`` as standard JSON (no NaN or Infinity; numbers of any size, read as 0).
    Raises ValueError, also for nesting too deep for the decoder."""
    try:
        return json.loads(text, parse_float=_number, parse_int=_number, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def is_json(text: str) -> bool:
    """Whether ``text`` is one JSON value (standard JSON: no NaN or Infinity; numbers
    of any size)."""
    try:
        _strict(text)
    except ValueError:
        return False
    return True


def is_json_object(text: str) -> bool:
    """Whether ``text`` is one JSON object (as `is_json` reads JSON)."""
    try:
        return isinstance(_strict(text), dict)
    except ValueError:
        return False


def dumps(value: Any) -> str:
    """JSON text as the parsers emit it: ``", "`` and ``": "`` separators, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False)
