"""Calls set off by markers, the shape most families share:

    [SECTION_BEGIN] CALL_BEGIN header ARGUMENTS tail CALL_END ... [SECTION_END]

A family describes its shape once as a `CallSyntax` (markers, and a `Template` for
the header between CALL_BEGIN and the arguments); `MarkedCallParser` reads any text
with it, and the family's constraint writes the same template.

How the parser reads what is not a well-formed call:

- text outside calls is content (whitespace next to a call is dropped);
- a header that does not match: the CALL_BEGIN marker and what follows are content;
- arguments cut short by a marker (CALL_END, the next CALL_BEGIN, SECTION_END) or by
  the end of the output end the call there: its arguments text is what was written;
- anything unexpected between the arguments and CALL_END ends the call and is read
  again as content.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from structured_output import GrammarSpec

from .base import FunctionTool, ToolCallParser, ToolFormat
from .grammar import (
    API_NAME_SYNTAX,
    Format,
    FreeText,
    alt,
    api_name_ok,
    const,
    json_value,
    layout,
    regex,
    repeated,
    select_tools,
    seq,
    structural_tag,
)
from .json_text import Incomplete, NoMatch
from .scanning import Markers, ScanParser

_FIELD = re.compile(r"\{(name|index)\}")
#: what a call index may be, in text and in the constraint
INDEX_PATTERN = r"(0|[1-9][0-9]{0,3})"


@dataclass(frozen=True)
class Template:
    """A header such as ``function<｜tool▁sep｜>{name}\\n```json\\n``: literal text with
    ``{name}`` (and ``{index}``) fields, each followed by literal text.

    Reading is lenient about whitespace only: a whitespace run in the template
    matches any whitespace run (or none) in the text. A field ends before the first
    character that can start the literal after it (any whitespace, if that literal
    starts with whitespace)."""

    text: str
    pieces: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        pieces = tuple(_FIELD.split(self.text))
        for k in range(1, len(pieces), 2):
            if not pieces[k + 1]:
                raise ValueError(f"template field {{{pieces[k]}}} must be followed by text")
        object.__setattr__(self, "pieces", pieces)

    def stop_chars(self, field_name: str) -> str:
        """The characters a field's value cannot contain."""
        k = self.pieces.index(field_name)
        nxt = self.pieces[k + 1]
        return " \t\r\n" if nxt[0].isspace() else nxt[0]

    def read(self, text: str, i: int) -> tuple[int, dict[str, str]]:
        """The header at ``i``: the index past it and its fields. Raises `Incomplete`
        or `NoMatch`."""
        fields: dict[str, str] = {}
        n = len(text)
        last = len(self.pieces) - 1
        for k, piece in enumerate(self.pieces):
            if k % 2 == 0:
                # Whitespace closing the header is left to the arguments' reader.
                for ch in piece.rstrip() if k == last else piece:
                    if ch.isspace():
                        while i < n and text[i].isspace():
                            i += 1
                    elif i == n:
                        raise Incomplete
                    elif text[i] != ch:
                        raise NoMatch
                    else:
                        i += 1
            else:
                stops = self.stop_chars(piece)
                j = i
                while j < n and text[j] not in stops:
                    j += 1
                if j == n:
                    raise Incomplete
                if j == i:
                    raise NoMatch
                fields[piece] = text[i:j]
                i = j
        return i, fields

    def grammar(self, markers: Sequence[str], *, name: str) -> Format:
        """The header for the tool ``name``, markers as their tokens."""
        parts: list[Format] = []
        for k, piece in enumerate(self.pieces):
            if k % 2 == 0:
                parts.append(layout(piece, markers))
            elif piece == "name":
                parts.append(const(name))
            else:
                parts.append(regex(INDEX_PATTERN))
        return seq(*parts)


@dataclass(frozen=True)
class CallSyntax:
    """One family's call shape (see the module docstring)."""

    call_begin: str
    #: None: a call ends where its arguments end
    call_end: str | None
    #: None: the family reads its header itself (`MarkedCallParser.read_header`)
    header: Template | None = None
    #: the text opening and closing the calls' section, as the constraint writes it;
    #: its markers are that text without surrounding whitespace
    section: tuple[str, str] | None = None
    #: text between the arguments and ``call_end``, in order (the parser skips
    #: whitespace around each piece, and a missing piece)
    tail: tuple[str, ...] = ()
    #: text the constraint writes between two calls (the parser skips whitespace)
    separator: str = ""

    @property
    def markers(self) -> tuple[str, ...]:
        """The markers that delimit calls (and sections)."""
        ms = [self.call_begin]
        if self.call_end:
            ms.append(self.call_end)
        if self.section_markers:
            ms.extend(self.section_markers)
        return tuple(ms)

    @property
    def section_markers(self) -> tuple[str, str] | None:
        if self.section is None:
            return None
        return (self.section[0].strip(), self.section[1].strip())


class MarkedCallParser(ScanParser):
    """Reads `CallSyntax` calls whose arguments are one JSON value; families with
    other arguments override `_arguments`."""

    syntax: ClassVar[CallSyntax]

    def __init__(
        self, fmt: ToolFormat, tools: Sequence[FunctionTool], *, named: str | None = None
    ) -> None:
        super().__init__(fmt, tools, named=named)
        syn = self.syntax
        section = syn.section_markers
        self._opening = Markers([section[0] if section else syn.call_begin])
        inner = [syn.call_begin] + ([section[1]] if section else [])
        self._inner = Markers(inner)
        #: markers that end a call's arguments wherever they appear
        self._cut = Markers(syn.markers)
        self._tail_step = 0
        #: in a section, nothing but whitespace since its opening or the last call
        self._fresh = False
        self._between: Callable[[], bool] = self._in_section if syn.section else self._outside
        self._arguments: Callable[[], bool] = self._json_arguments

    def _start(self) -> bool:
        self._state = self._outside
        return True

    def _outside(self) -> bool:
        pos = self._pos
        text, marker = self._until(self._opening)
        self._content(text)
        if marker is None:
            return self._pos != pos
        self._state = self._in_section if self.syntax.section else self._header
        self._fresh = True
        return True

    def _in_section(self) -> bool:
        """Inside a section: whitespace after its opening or after a call is markup;
        any other text there is content."""
        pos = self._pos
        text, marker = self._until(self._inner)
        if self._fresh:
            text = text.lstrip()
            self._fresh = not text
        self._content(text)
        if marker == self.syntax.call_begin:
            self._state = self._header
        elif marker is not None:
            self._state = self._outside
        return self._pos != pos

    def _header(self) -> bool:
        try:
            end, name, call_id = self._header_at(self.read_header, self._pos)
        except Incomplete:
            return False
        except NoMatch:
            return self._not_a_call()
        self._pos += end
        self._open_call(name, call_id)
        self._state = self._arguments
        return True

    def _close_call(self) -> None:
        super()._close_call()
        self._fresh = True

    def read_header(self, text: str, i: int) -> tuple[int, str, str | None]:
        """The header at ``i``: the index where the arguments begin, the name, and the
        call id the text carries (None: generate one). Raises `Incomplete`/`NoMatch`."""
        header = self.syntax.header
        if header is None:
            raise NotImplementedError(f"{type(self).__name__} must read its header")
        end, fields = header.read(text, i)
        return end, fields["name"], None

    def _not_a_call(self) -> bool:
        self._content(self.syntax.call_begin)
        self._state = self._between
        return True

    def _json_arguments(self) -> bool:
        pos = self._pos
        ended = self._stream_json(self._cut)
        if ended is None:
            return self._pos != pos
        self._end_arguments()
        return True

    def _end_arguments(self) -> None:
        self._tail_step = 0
        if self.syntax.call_end is None:
            self._close_call()
            self._state = self._between
        else:
            self._state = self._tail

    def _tail(self) -> bool:
        syn = self.syntax
        start = self._pos
        self._skip_ws()
        buf, pos = self._buf, self._pos
        rest = buf[pos : pos + 64]
        expected = [t.strip() for t in syn.tail[self._tail_step :]] + [syn.call_end]
        for k, literal in enumerate(expected):
            if buf.startswith(literal, pos):
                self._pos = pos + len(literal)
                if k == len(expected) - 1:
                    self._close_call()
                    self._state = self._between
                else:
                    self._tail_step += k + 1
                return True
            if not self._final and literal.startswith(rest):
                return pos != start
        # Anything else (or the end of the output) ends the call.
        self._close_call()
        self._state = self._between
        return True


def call_format(syntax: CallSyntax, markers: Sequence[str], name: str, arguments: Format) -> Format:
    """One call of ``name`` in ``syntax``, markers as their tokens."""
    if syntax.header is None:
        raise ValueError("a syntax without a header template writes its calls itself")
    return seq(
        layout(syntax.call_begin, markers),
        syntax.header.grammar(markers, name=name),
        arguments,
        *(layout(t, markers) for t in syntax.tail),
        layout(syntax.call_end or "", markers),
    )


def calls_format(
    syntax: CallSyntax, markers: Sequence[str], calls: Sequence[Format], *, many: bool
) -> Format:
    """One of ``calls`` (or, with ``many``, one or more with the separator between),
    inside the section markers if the syntax has them."""
    body = repeated(alt(calls), separator=layout(syntax.separator, markers), parallel=many)
    if syntax.section:
        body = seq(layout(syntax.section[0], markers), body, layout(syntax.section[1], markers))
    return body


class JsonArgumentsFormat(ToolFormat):
    """A family whose calls are `CallSyntax` with a header `Template` and one JSON
    value of arguments; the family file sets the class attributes."""

    syntax: ClassVar[CallSyntax]
    #: short substrings of the family's markers that keep them all out of argument
    #: strings (cheaper to compile than the markers themselves)
    marker_covers: ClassVar[tuple[str, ...]] = ()
    parser_class: ClassVar[type[MarkedCallParser]]

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, api_name_ok, API_NAME_SYNTAX)
        free = FreeText.build(self.tokenizer, self.special_markers, self.marker_covers)
        markers = self.special_markers
        calls = [
            call_format(self.syntax, markers, t.name, json_value(t.schema, free)) for t in chosen
        ]
        many = parallel and named is None
        return structural_tag(calls_format(self.syntax, markers, calls, many=many))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None
    ) -> ToolCallParser:
        return self.parser_class(self, tools, named=named)
