"""Pythonic calls (Llama 3.2/4 and others): a Python list of calls with keyword
arguments, read with the standard ``ast`` module, never evaluated::

    [get_weather(city='Paris'), get_time(tz='CET')]

`CALLS` is the one description: the list's brackets, the call's parentheses, ``=``
and the separator, which the constraint writes and the parser reads.

Constraint: ``[`` calls separated by ``", "`` ``]``, each ``NAME(`` keyword
arguments ``)`` with values as Python literals of the parameter schema
(`python_literal`; required parameters first). Tool and parameter names must be
Python identifiers that are not keywords.

Parser: the list is recognised only at the start of the output (after whitespace);
whitespace is free between its tokens. A call counts once its ``)`` closes it with
every argument a keyword and every value a literal of JSON data (converted as each
value completes). A call that is not that (a name that is no tool of the request, a
positional argument, a value that is a name, call or expression, Python that does
not parse, a call the output cuts short) is content, and so is everything after it;
the calls before it stand. An output that does not open with ``[NAME(`` is all
content, and so is the list when its first call fails. Text after the closing ``]``
is content.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence
from dataclasses import dataclass

from structured_output import GrammarSpec

from .base import FunctionTool, Markup, ToolCallParser, ToolFormat, ToolFormatError
from .grammar import (
    FreeText,
    alt,
    const,
    optional,
    regex,
    repeated,
    select_tools,
    seq,
    star,
    structural_tag,
)
from .json_text import dumps
from .python_literal import PyExtent, any_literal, arguments, literal_format, literal_json
from .scanning import ScanParser
from .schemas import object_properties

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CALLEE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
#: longest unfinished name the parser waits for before it gives up on a call
_MAX_NAME = 256


@dataclass(frozen=True)
class PythonCalls:
    """A list of calls with keyword arguments: ``[f(a=1), g()]``. The constraint
    writes these texts exactly; the parser reads each with whitespace around it
    (and ``separator`` without its space)."""

    opening: str = "["
    closing: str = "]"
    #: between two calls and between two arguments
    separator: str = ", "
    call_open: str = "("
    call_close: str = ")"
    assign: str = "="

    @property
    def markup(self) -> tuple[str, ...]:
        texts = (self.opening, self.closing, self.separator.strip(), self.call_open)
        return (*texts, self.call_close, self.assign)


CALLS = PythonCalls()


def identifier_ok(name: str) -> bool:
    return _IDENT.fullmatch(name) is not None and not keyword.iskeyword(name)


class PythonicToolFormat(ToolFormat):
    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(
            self.name, tools, named, identifier_ok, "Python identifiers, not keywords"
        )
        free = FreeText.build(self.tokenizer, ())
        calls = [
            seq(const(t.name + CALLS.call_open), self._kwargs(t, free), const(CALLS.call_close))
            for t in chosen
        ]
        many = parallel and named is None
        body = repeated(alt(calls), separator=const(CALLS.separator), parallel=many)
        return structural_tag(seq(const(CALLS.opening), body, const(CALLS.closing)))

    def _kwargs(self, tool: FunctionTool, free: FreeText) -> dict:
        schema = tool.schema
        props, free_form = object_properties(schema, schema)
        parts = []
        for p in props:
            if not identifier_ok(p.name):
                raise ToolFormatError(
                    f"tool-call format {self.name!r} cannot carry the parameter name "
                    f"{p.name!r}: names must be Python identifiers, not keywords"
                )
            value = literal_format(p.schema, schema, free)
            parts.append((seq(const(p.name + CALLS.assign), value), p.required))
        if free_form:
            kw = seq(regex(_IDENT.pattern), const(CALLS.assign), any_literal(free))
            return optional(seq(kw, star(seq(const(CALLS.separator), kw))))
        return arguments(parts, CALLS.separator)

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None, forced: bool = False
    ) -> ToolCallParser:
        return PythonicParser(self, tools, named=named, forced=forced)

    @property
    def markup(self) -> Markup:
        return Markup(CALLS.markup, CALLS.separator)


class PythonicParser(ScanParser):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._value: list[str] = []
        self._separator = CALLS.separator.strip()
        self._extent = PyExtent(self._separator)
        self._key = ""
        self._written = 0

    # ----- where the list starts ------------------------------------------------

    def _start(self) -> bool:
        """Decide, without consuming anything, whether the output opens with a call."""
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i].isspace():
            i += 1
        if i == len(buf):
            return self._undecided()
        if not buf.startswith(CALLS.opening, i):
            return self._no_calls()
        verdict = _callee_at(buf, i + len(CALLS.opening))
        if verdict is None:
            return self._undecided()
        if not verdict:
            return self._no_calls()
        self._begin_call(self._pos)  # the first call's text starts with the list
        self._pos = i + len(CALLS.opening)
        self._state = self._callee
        return True

    def _undecided(self) -> bool:
        if not self._final:
            return False
        return self._no_calls()

    def _no_calls(self) -> bool:
        self._state = self._rest_is_content
        return True

    # ----- calls ---------------------------------------------------------------

    def _callee(self) -> bool:
        buf = self._buf
        verdict = _callee_at(buf, self._pos)
        if verdict is None and not self._final:
            return False
        if not verdict:
            return self._malformed()
        name, end = verdict
        self._begin_call(self._pos)
        if not self._name_call(name):
            return self._malformed()
        self._pos = end
        self._written = 0
        self._state = self._keyword
        return True

    def _keyword(self) -> bool:
        start = self._pos
        self._skip_ws()
        buf, i = self._buf, self._pos
        if i == len(buf):
            return i != start if not self._final else self._malformed()
        if buf.startswith(CALLS.call_close, i):
            self._pos = i + len(CALLS.call_close)
            self._args("{}" if self._written == 0 else "}")
            if not self._end_call():
                return self._malformed()
            self._state = self._after_call
            return True
        m = _IDENT.match(buf, i)
        if m is None:
            return self._malformed()
        j = m.end()
        while j < len(buf) and buf[j].isspace():
            j += 1
        assign = CALLS.assign
        if not self._final and (j == len(buf) or (buf[j] == assign and j + 1 == len(buf))):
            return i != start  # "=" may turn out to be "=="
        if not buf.startswith(assign, j) or buf.startswith(assign * 2, j):
            return self._malformed()
        self._key = m.group()
        self._pos = j + len(assign)
        self._value = []
        self._extent = PyExtent(self._separator)
        self._state = self._literal
        return True

    def _literal(self) -> bool:
        buf, pos = self._buf, self._pos
        stop, ended = self._extent.feed(buf, pos, self._final)
        self._value.append(buf[pos:stop])
        self._pos = stop
        if not ended and not self._final:
            return stop != pos
        if not ended:
            return self._malformed()  # the output ended inside the value
        try:
            value = literal_json("".join(self._value))
        except ValueError:
            return self._malformed()
        self._args(("{" if self._written == 0 else ", ") + dumps(self._key) + ": " + value)
        self._written += 1
        self._state = self._after_value
        return True

    def _after_value(self) -> bool:
        start = self._pos
        self._skip_ws()
        buf, i = self._buf, self._pos
        if i == len(buf):
            return i != start if not self._final else self._malformed()
        if buf.startswith(self._separator, i):
            self._pos = i + len(self._separator)
            self._state = self._keyword
            return True
        if buf.startswith(CALLS.call_close, i):
            self._state = self._keyword  # reads the call's close
            return True
        return self._malformed()

    def _after_call(self) -> bool:
        start = self._pos
        self._skip_ws()
        buf, i = self._buf, self._pos
        if i == len(buf):
            if not self._final:
                return i != start
            self._state = self._rest_is_content
            return True
        if buf.startswith(self._separator, i):
            self._pos = i + len(self._separator)
            self._state = self._callee
            return True
        if buf.startswith(CALLS.closing, i):
            self._pos = i + len(CALLS.closing)
        self._state = self._rest_is_content
        return True

    def _malformed(self) -> bool:
        """Not (or no longer) a call list: a call being read is content, and so is
        the rest."""
        if self._call is not None:
            self._fail_call()
        self._state = self._rest_is_content
        return True


def _callee_at(text: str, i: int) -> tuple[str, int] | bool | None:
    """``NAME(`` (`CALLS`) at ``i`` after whitespace: the name and the index past the
    parenthesis; False if the text is not that; None if it cannot be told yet."""
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    m = _CALLEE.match(text, i)
    if m is None:
        return None if i == n else False
    j = m.end()
    if j == n or (text[j] == "." and j + 1 == n):  # the name may go on
        return None if j - i <= _MAX_NAME else False
    while j < n and text[j].isspace():
        j += 1
    if j == n:
        return None
    opened = text.startswith(CALLS.call_open, j)
    return (m.group(), j + len(CALLS.call_open)) if opened else False
