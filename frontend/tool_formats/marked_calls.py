"""Calls set off by markers, the shape most families share:

    [SECTION_BEGIN] CALL_BEGIN header ARGUMENTS tail CALL_END ... [SECTION_END]

A family describes its shape once as a `CallSyntax` (markers, and a header: a
`Template` such as ``function<｜tool▁sep｜>{name}`` before JSON arguments, or a
`CallObject`, ``{"name": NAME, "arguments": ARGUMENTS}``); `MarkedCallParser` reads
any text with it, and the family's constraint writes the same description.

How the parser reads what is not a well-formed call (see `scanning` for when a call
counts):

- text outside calls is content (whitespace next to a call is dropped); section
  markers are markup, never content;
- whitespace is free around every special marker, around the header's fields and
  wherever the header has whitespace; a header whose closing text ends its line may
  stop at the end of the line (``<function=f`` newline);
- a header that does not match, or names no tool of the request: the CALL_BEGIN
  marker is content, and what follows is read again;
- a call counts once its arguments are complete and valid; what follows them (the
  tail, CALL_END) may be missing: anything unexpected there is read again as content;
- arguments cut short by a marker (CALL_END, the next CALL_BEGIN, SECTION_END) or by
  the end of the output: not a call, its text is content, and the marker is read
  again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from structured_output import GrammarSpec

from .base import FunctionTool, Markup, ToolCallParser, ToolFormat
from .call_objects import CALL_OBJECT_MARKUP, call_object, read_object_header
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
from .scanning import MarkerSet, ScanParser

_FIELD = re.compile(r"\{(name|index)\}")
#: what a call index may be, in text and in the constraint
INDEX_PATTERN = r"(0|[1-9][0-9]{0,3})"
_WS = " \t\r\n"
#: characters no field holds: whitespace and the punctuation of markup (a name such
#: as ``get_weather`` ends before ``>``, ``<``, ``:``, a backtick...)
FIELD_STOPS = frozenset(_WS + "<>[]{}()\"'`:=|,;")


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


@dataclass(frozen=True)
class Template:
    """A header such as ``function<｜tool▁sep｜>{name}\\n```json\\n``: literal text with
    ``{name}`` (and ``{index}``) fields, each followed by literal text.

    Reading is lenient about whitespace: a whitespace run in the template matches
    any whitespace run (or none) in the text, and whitespace is free at the start,
    around each field and around each of ``markers`` (the special tokens inside the
    template). A field ends before whitespace or markup punctuation (`FIELD_STOPS`).
    When the template ends with a line break after its last field, a text that breaks
    the line right after that field and then goes on with something else ends the
    header there (a model that left out ``<function=f``'s ``>``)."""

    text: str
    markers: tuple[str, ...] = ()
    pieces: tuple[str, ...] = field(init=False)
    _atoms: tuple[tuple[str, ...], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        pieces = tuple(_FIELD.split(self.text))
        for k in range(1, len(pieces), 2):
            if not pieces[k + 1]:
                raise ValueError(f"template field {{{pieces[k]}}} must be followed by text")
        object.__setattr__(self, "pieces", pieces)
        split = re.compile(
            "(" + "|".join([r"\s+", *map(re.escape, sorted(self.markers, key=len)[::-1])]) + ")"
        )
        atoms = []
        for k, piece in enumerate(pieces):
            text = piece.rstrip() if k == len(pieces) - 1 else piece
            atoms.append(tuple(a for a in split.split(text) if a) if k % 2 == 0 else ())
        object.__setattr__(self, "_atoms", tuple(atoms))

    @property
    def literals(self) -> tuple[str, ...]:
        """The template's fixed texts, split at whitespace and markers."""
        return tuple(a for atoms in self._atoms for a in atoms if not a.isspace())

    def _line_closes(self) -> bool:
        last = self.pieces[-1]
        return len(self.pieces) > 1 and last.endswith("\n") and bool(last.strip())

    def read(self, text: str, i: int) -> tuple[int, dict[str, str]]:
        """The header at ``i``: the index past it and its fields. Raises `Incomplete`
        or `NoMatch`."""
        fields: dict[str, str] = {}
        n = len(text)
        i = _skip_ws(text, i)
        broke_line = False
        last = len(self.pieces) - 1
        for k, piece in enumerate(self.pieces):
            if k % 2:
                j = i = _skip_ws(text, i)
                while j < n and text[j] not in FIELD_STOPS:
                    j += 1
                if j == n:
                    raise Incomplete
                if j == i:
                    raise NoMatch
                fields[piece] = text[i:j]
                i = _skip_ws(text, j)
                broke_line = "\n" in text[j:i]
                continue
            for atom in self._atoms[k]:
                if atom.isspace():
                    i = _skip_ws(text, i)
                    continue
                marker = atom in self.markers
                if marker:
                    i = _skip_ws(text, i)
                got = text[i : i + len(atom)]
                if got != atom:
                    if atom.startswith(got) and i + len(got) == n:
                        raise Incomplete
                    if k == last and k and broke_line and self._line_closes():
                        return i, fields
                    raise NoMatch
                i += len(atom)
                if marker and k != last:
                    i = _skip_ws(text, i)
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
class CallObject:
    """A header that opens a JSON call object, ``{"name": NAME, "arguments": ``: the
    arguments are that object's value and its ``}`` follows them. The constraint
    writes ``lead`` and then the whole object as ONE JSON schema over every offered
    tool (`call_objects.call_object_schema`), so that keeping markers out of its
    strings is compiled once, not once per tool; for one tool, its header is forced
    text (`call_objects.call_object`). The parser reads ``"arguments"`` or
    ``"parameters"``; the name must come first."""

    #: the arguments key the constraint writes
    args_key: str = "arguments"
    #: text the constraint writes before the object (the parser skips whitespace)
    lead: str = ""
    closer: ClassVar[str] = "}"

    def read(self, text: str, i: int) -> tuple[int, dict[str, str]]:
        end, name = read_object_header(text, i)
        return end, {"name": name}


@dataclass(frozen=True)
class CallSyntax:
    """One family's call shape (see the module docstring)."""

    call_begin: str
    #: None: a call ends where its arguments end
    call_end: str | None
    #: None: the family reads its header itself (`MarkedCallParser.read_header`)
    header: Template | CallObject | None = None
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

    @property
    def closers(self) -> tuple[str, ...]:
        """What the parser expects after the arguments, before ``call_end``."""
        closer = (self.header.closer,) if isinstance(self.header, CallObject) else ()
        return tuple(p for p in (*closer, *(t.strip() for t in self.tail)) if p)

    @property
    def markup(self) -> tuple[str, ...]:
        """Every fixed text of the syntax."""
        header: tuple[str, ...] = ()
        if isinstance(self.header, Template):
            header = self.header.literals
        elif isinstance(self.header, CallObject):
            header = CALL_OBJECT_MARKUP
        texts = (*self.markers, *header, *self.closers, self.separator.strip())
        return tuple(dict.fromkeys(t for t in texts if t))


class MarkedCallParser(ScanParser):
    """Reads calls in the `CallSyntax` of its format (``fmt.syntax``) whose arguments
    are one JSON value; families with other arguments override `_arguments`."""

    def __init__(
        self,
        fmt: ToolFormat,
        tools: Sequence[FunctionTool],
        *,
        named: str | None = None,
        forced: bool = False,
    ) -> None:
        super().__init__(fmt, tools, named=named, forced=forced)
        syn: CallSyntax = fmt.syntax  # type: ignore[attr-defined]
        self.syntax = syn
        section = syn.section_markers
        self._opening = MarkerSet([section[0] if section else syn.call_begin])
        inner = [syn.call_begin] + ([section[1]] if section else [])
        self._inner = MarkerSet(inner)
        #: markers that end a call's arguments wherever they appear
        self._cut = MarkerSet(syn.markers)
        self._closers = syn.closers
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
        if self.syntax.section:
            self._state = self._in_section
            self._fresh = True
        else:
            self._begin_call(self._pos - len(marker))
            self._state = self._header
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
            self._begin_call(self._pos - len(marker))
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
        if not self._name_call(name, call_id):
            return self._not_a_call()
        self._pos += end
        self._state = self._arguments
        return True

    def read_header(self, text: str, i: int) -> tuple[int, str, str | None]:
        """The header at ``i``: the index where the arguments begin, the name, and the
        call id the text carries (None: generate one). Raises `Incomplete`/`NoMatch`."""
        header = self.syntax.header
        if header is None:
            raise NotImplementedError(f"{type(self).__name__} must read its header")
        end, fields = header.read(text, i)
        return end, fields["name"], None

    def _not_a_call(self) -> bool:
        """What was read of the call so far (its marker at least) is content; what
        follows is read again."""
        self._fail_call()
        self._state = self._between
        return True

    def _json_arguments(self) -> bool:
        pos = self._pos
        ended = self._read_json(self._cut)
        if ended is None:
            return self._pos != pos
        if not ended:
            return self._not_a_call()
        if self._end_call():
            self._after_arguments()
        else:
            self._state = self._between
        return True

    def _after_arguments(self) -> None:
        """The call came out: read its closers and end marker, if any."""
        self._tail_step = 0
        if self.syntax.call_end is None:
            self._call_read()
        else:
            self._state = self._tail

    def _call_read(self) -> None:
        self._fresh = True
        self._state = self._between

    def _tail(self) -> bool:
        start = self._pos
        self._skip_ws()
        buf, pos = self._buf, self._pos
        rest = buf[pos : pos + 64]
        expected = [*self._closers[self._tail_step :], self.syntax.call_end]
        for k, literal in enumerate(expected):
            assert literal is not None
            if buf.startswith(literal, pos):
                self._pos = pos + len(literal)
                if k == len(expected) - 1:
                    self._call_read()
                else:
                    self._tail_step += k + 1
                return True
            if not self._final and literal.startswith(rest):
                return pos != start
        # Anything else (or the end of the output) is read again, after the call.
        self._call_read()
        return True


def call_format(syntax: CallSyntax, markers: Sequence[str], name: str, arguments: Format) -> Format:
    """One call of ``name`` in ``syntax`` with a `Template` header, markers as their
    tokens."""
    if not isinstance(syntax.header, Template):
        raise ValueError("only a syntax with a header template writes one call per tool")
    return seq(
        layout(syntax.call_begin, markers),
        syntax.header.grammar(markers, name=name),
        arguments,
        *(layout(t, markers) for t in syntax.tail),
        layout(syntax.call_end or "", markers),
    )


def json_calls(
    syntax: CallSyntax, markers: Sequence[str], tools: Sequence[FunctionTool], free: FreeText
) -> list[Format]:
    """The alternatives for one call of any of ``tools`` with JSON arguments: one per
    tool under a `Template` header, one for them all under a `CallObject`."""
    header = syntax.header
    if isinstance(header, Template):
        return [call_format(syntax, markers, t.name, json_value(t.schema, free)) for t in tools]
    if not isinstance(header, CallObject):
        raise ValueError("a syntax without a header writes its calls itself")
    return [
        seq(
            layout(syntax.call_begin + header.lead, markers),
            call_object(tools, header.args_key, free),
            *(layout(t, markers) for t in syntax.tail),
            layout(syntax.call_end or "", markers),
        )
    ]


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
    """A family whose calls are `CallSyntax` with one JSON value of arguments; the
    family file sets the class attributes."""

    syntax: ClassVar[CallSyntax]
    #: short substrings of the family's markers that keep them all out of argument
    #: strings (cheaper to compile than the markers themselves)
    marker_covers: ClassVar[tuple[str, ...]] = ()
    parser_class: ClassVar[type[MarkedCallParser]] = MarkedCallParser
    #: which tool names the header can carry
    name_ok: ClassVar[Callable[[str], bool]] = staticmethod(api_name_ok)
    name_syntax: ClassVar[str] = API_NAME_SYNTAX

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, type(self).name_ok, self.name_syntax)
        markers = self.special_markers
        free = FreeText.build(self.tokenizer, (*markers, *self.syntax.markers), self.marker_covers)
        calls = json_calls(self.syntax, markers, chosen, free)
        many = parallel and named is None
        return structural_tag(calls_format(self.syntax, markers, calls, many=many))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None, forced: bool = False
    ) -> ToolCallParser:
        return self.parser_class(self, tools, named=named, forced=forced)

    @property
    def markup(self) -> Markup:
        return Markup(self.syntax.markup, self.syntax.separator)
