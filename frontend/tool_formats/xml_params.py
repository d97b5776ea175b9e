"""Parameters written as markup (qwen3_coder, glm45, minimax_m2): each parameter's
value is raw text between its tags, read as JSON by the tool's parameter schema.

One rule decides how a value reads, and both the parser and the constraint follow it
(`value_kind`):

- TEXT: the schema admits strings only (``type: string``, string enums and consts,
  unions of those). The raw text is the string, verbatim; the constraint writes it
  raw, without markers, and within its enum, pattern or length.
- JSON: anything else (numbers, booleans, objects, arrays, null, unions with
  non-strings, no schema). The raw text is JSON; text that is not JSON reads as a
  string. The constraint writes JSON of the schema.

A family whose markup puts a newline inside the tags on each side of the value
(``newline_wrapped``: qwen3_coder) has exactly one newline stripped from each side.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from structured_output import GrammarSpec

from .base import FunctionTool, Markup, ToolCallParser, ToolFormat, ToolFormatError
from .grammar import (
    API_NAME_SYNTAX,
    MAX_ENFORCED_LENGTH,
    NOT_TEXT,
    Format,
    FreeText,
    alt,
    any_text,
    api_name_ok,
    const,
    json_value,
    layout,
    optional,
    regex,
    select_tools,
    seq,
    star,
    structural_tag,
    vocabulary_covers,
)
from .json_text import JsonExtent, dumps, is_json
from .marked_calls import CallSyntax, MarkedCallParser, call_format, calls_format
from .scanning import MarkerSet
from .schemas import object_properties, resolve, with_defs

#: a parameter name when the schema declares none
FREE_KEY_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,31}"
#: longest raw key a parser waits for before it reads the markup as junk
_MAX_KEY = 256


class Kind(Enum):
    TEXT = "text"
    JSON = "json"


def value_kind(schema: Any, root: Any) -> Kind:
    """How a parameter's raw text reads (see the module docstring)."""
    s = resolve(schema, root)
    if not isinstance(s, dict) or not s:
        return Kind.JSON
    if "const" in s:
        return Kind.TEXT if isinstance(s["const"], str) else Kind.JSON
    if "enum" in s:
        values = s["enum"]
        return Kind.TEXT if values and all(isinstance(v, str) for v in values) else Kind.JSON
    for key in ("anyOf", "oneOf"):
        if key in s:
            kinds = {value_kind(a, root) for a in s[key]}
            return Kind.TEXT if kinds == {Kind.TEXT} and "type" not in s else Kind.JSON
    return Kind.TEXT if s.get("type") == "string" else Kind.JSON


@dataclass(frozen=True)
class ParamSyntax:
    """How one family writes a parameter::

        key_begin KEY key_end gap value_begin ["\\n"] VALUE ["\\n"] value_end "\\n"

    (the bracketed newlines when ``newline_wrapped``)."""

    key_begin: str
    key_end: str
    value_end: str
    gap: str = ""
    value_begin: str = ""
    newline_wrapped: bool = False
    #: characters a parameter name cannot hold: the constraint refuses such names, and
    #: the parser ends a name at the first of them (or at ``key_end``)
    key_forbidden: str = "<>\n"

    @property
    def markup(self) -> tuple[str, ...]:
        texts = (self.key_begin, self.key_end, self.value_begin, self.value_end)
        return tuple(t.strip() for t in texts if t.strip())

    def before_value(self) -> str:
        """Markup from the key's end to the value."""
        return self.key_end + self.gap + self.value_begin + ("\n" if self.newline_wrapped else "")

    def after_value(self) -> str:
        return ("\n" if self.newline_wrapped else "") + self.value_end + "\n"


class ValueWriter:
    """Turns one parameter's raw text, arriving in pieces, into JSON text: a TEXT value
    streams as an escaped JSON string; a JSON value is read once complete, unless
    ``trusted`` (a forced call: the constraint wrote JSON of the schema), when it
    streams as written, surrounding whitespace left out (as the complete value strips
    it)."""

    __slots__ = ("kind", "started", "_wrapped", "_trusted", "_held", "_raw", "_shown")

    def __init__(self, kind: Kind, newline_wrapped: bool, *, trusted: bool = False) -> None:
        self.kind = kind
        #: some raw text has arrived
        self.started = False
        self._wrapped = newline_wrapped
        self._trusted = trusted and kind is Kind.JSON
        self._held = ""
        self._raw: list[str] = []
        #: trusted: some of the value came out
        self._shown = False

    def begin(self) -> str:
        return '"' if self.kind is Kind.TEXT else ""

    def feed(self, raw: str) -> str:
        if not raw:
            return ""
        if self._wrapped and not self.started and raw[0] == "\n":
            raw = raw[1:]
        self.started = True
        if self._trusted:
            return self._stream(raw)
        if self.kind is Kind.JSON:
            self._raw.append(raw)
            return ""
        text = self._held + raw
        self._held = "\n" if self._wrapped and text.endswith("\n") else ""
        if self._held:
            text = text[:-1]
        return _escape(text)

    def _stream(self, raw: str) -> str:
        """A trusted JSON value's text: whitespace at its start dropped, at its end held
        (in ``_raw``) until text follows it."""
        body = raw.rstrip()
        if not body:
            self._raw.append(raw)
            return ""
        held = "".join(self._raw)
        self._raw = [raw[len(body) :]] if len(body) < len(raw) else []
        if not self._shown:
            self._shown = True
            return (held + body).lstrip()
        return held + body

    def end(self) -> str:
        if self.kind is Kind.TEXT:
            return '"'
        raw = "".join(self._raw)
        if self._wrapped and raw.endswith("\n"):
            raw = raw[:-1]
        if self._shown:
            return ""
        value = raw.strip()
        return value if is_json(value) else dumps(raw)


def _escape(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1] if text else ""


def value_stops(syntax: CallSyntax, params: ParamSyntax) -> list[str]:
    """Where a value's raw text ends: its ``value_end``, or, where that is missing,
    the next parameter, the call's closers or a call marker. The constraint keeps all
    of them out of raw values, so that the two read a value alike."""
    return [params.value_end, params.key_begin, *syntax.closers, *syntax.markers]


class XmlParamsParser(MarkedCallParser):
    """A `MarkedCallParser` whose arguments are parameters in `ParamSyntax` markup.

    The parameters end at the first thing that is not a parameter (the family's
    closers or call end, or junk, which is read again after the call). A name ends
    at ``key_end``, or, where that is missing, before a character names cannot hold.
    A value ends where `value_stops` says; a value the end of the output cuts short
    makes the call not a call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p: ParamSyntax = self.format.params  # type: ignore[attr-defined]
        self.params = p
        self._arguments = self._next_param
        ends = {*p.key_forbidden, p.key_end[0], *(m[0] for m in self.syntax.markers)}
        self._key_stop = re.compile("[" + re.escape("".join(sorted(ends))) + "]")
        self._value_stops = MarkerSet(value_stops(self.syntax, p))
        #: inside a JSON value's strings only the special-token markers cut
        self._hard = MarkerSet(hard_markers(self.syntax, self.format.special_markers))
        self._writer: ValueWriter | None = None
        self._written = 0
        self._schema: Any = None

    def _name_call(self, name: str, call_id: str | None = None) -> bool:
        if not super()._name_call(name, call_id):
            return False
        self._schema = self.tools_by_name[name].schema
        self._written = 0
        return True

    def _next_param(self) -> bool:
        start = self._pos
        self._skip_ws()
        buf, pos = self._buf, self._pos
        begin = self.params.key_begin
        if buf.startswith(begin, pos):
            self._state = self._key
            return True
        if not self._final and begin.startswith(buf[pos : pos + len(begin)]):
            return pos != start
        return self._params_done()

    def _params_done(self) -> bool:
        """No more parameters: the call is complete."""
        self._args("{}" if self._written == 0 else "}")
        if self._end_call():
            self._after_arguments()
        else:
            self._state = self._between
        return True

    def _key(self) -> bool:
        """A parameter's name, from its ``key_begin`` (left unread until decided)."""
        p = self.params
        buf = self._buf
        at = self._pos + len(p.key_begin)
        limit = min(len(buf), at + _MAX_KEY)
        m = self._key_stop.search(buf, at, limit)
        if m is None:
            if limit == len(buf) and limit - at < _MAX_KEY and not self._final:
                return False
            return self._params_done()  # not a parameter: read again after the call
        j = m.start()
        end = j
        if buf.startswith(p.key_end, j):
            end = j + len(p.key_end)
        elif p.key_end.startswith(buf[j:]) and not self._final:
            return False
        key = buf[at:j].strip()
        if not key:
            return self._params_done()
        self._pos = end
        kind = self._kind_of(key)
        self._writer = ValueWriter(kind, p.newline_wrapped, trusted=self.forced)
        self._args(("{" if self._written == 0 else ", ") + dumps(key) + ": " + self._writer.begin())
        self._written += 1
        self._state = self._value_open if p.value_begin else self._value
        return True

    def _kind_of(self, key: str) -> Kind:
        if self._schema is None:
            return Kind.JSON
        s = resolve(self._schema, self._schema)
        props = s.get("properties") if isinstance(s, dict) else None
        if not isinstance(props, dict) or key not in props:
            return Kind.JSON
        return value_kind(props[key], self._schema)

    def _value_open(self) -> bool:
        start = self._pos
        self._skip_ws()
        buf, pos = self._buf, self._pos
        vb = self.params.value_begin
        if buf.startswith(vb, pos):
            self._pos = pos + len(vb)
        elif not self._final and vb.startswith(buf[pos : pos + len(vb)]):
            return pos != start
        self._state = self._value
        return True

    def _value(self) -> bool:
        """A value's raw text up to where `value_stops` says. A JSON value that opens
        a string, array or object is read as JSON first, so a stop inside one of its
        strings does not end it (special-token markers still do)."""
        writer = self._writer
        assert writer is not None
        pos = self._pos
        if writer.kind is Kind.JSON and not writer.started:
            buf = self._buf
            i = pos
            while i < len(buf) and buf[i].isspace():
                i += 1
            if i == len(buf) and not self._final:
                return False
            if i < len(buf) and buf[i] in '{["':
                self._state = self._json_value
                return True
        text, marker = self._until(self._value_stops)
        self._args(writer.feed(text))
        if marker is None:
            if not self._final:
                return self._pos != pos
            return self._value_cut()
        if marker == self.params.value_end:
            self._end_value(True)
        else:
            self._pos -= len(marker)  # the value's closer is missing: read the marker again
            self._end_value(marker == self.params.key_begin)
        return True

    def _json_value(self) -> bool:
        writer = self._writer
        assert writer is not None
        buf, pos = self._buf, self._pos
        end, m = self._reach(self._hard)
        _, stop = self._json.feed(buf, pos, end)
        self._args(writer.feed(buf[pos:stop]))
        self._pos = stop
        if self._json.done:
            self._json = JsonExtent()
            self._state = self._value  # the rest, up to its stop, is read as text
            return True
        if m is None and not self._final:
            return stop != pos
        self._json = JsonExtent()
        if m is None:
            return self._value_cut()
        self._end_value(False)  # a call marker cut it: it reads as text
        return True

    def _value_cut(self) -> bool:
        """The output ended inside a value: the call is not a call."""
        self._writer = None
        self._fail_call()
        self._state = self._between
        return True

    def _end_value(self, more: bool) -> None:
        """The value is complete; ``more``: parameters may follow."""
        assert self._writer is not None
        self._args(self._writer.end())
        self._writer = None
        self._state = self._next_param if more else self._params_done


def raw_text_format(schema: Any, root: Any, free: FreeText, excludes: Sequence[str]) -> Format:
    """The raw text of a TEXT value of ``schema``: within its const, enum, pattern or
    length (a ``maxLength`` up to `MAX_ENFORCED_LENGTH`), holding none of
    ``excludes``. A ``format`` is not enforced."""
    s = resolve(schema, root)
    if "const" in s:
        return const(_writable(s["const"], excludes))
    if "enum" in s:
        values = [v for v in s["enum"] if not any(e in v for e in excludes)]
        if not values:
            raise ToolFormatError(f"no value of the enum {s['enum']!r} can be written as raw text")
        return alt(const(v) for v in values)
    for key in ("anyOf", "oneOf"):
        if key in s:
            return alt(raw_text_format(a, root, free, excludes) for a in s[key])
    if "pattern" in s:
        return regex(s["pattern"])
    low = min(int(s.get("minLength", 0)), MAX_ENFORCED_LENGTH)
    high = s.get("maxLength")
    if high is not None and int(high) > MAX_ENFORCED_LENGTH:
        high = None
    if not low and high is None:
        return any_text(excludes)
    # A bounded text is a character class repeated: exact in characters (xgrammar's
    # any_text budget is not), keeping out the markers' first characters.
    bar = _class_escape(free.barred)
    upper = "" if high is None else str(int(high))
    return regex(f"[^{bar}{NOT_TEXT}]{{{low},{upper}}}")


def _class_escape(chars: str) -> str:
    return "".join("\\" + c if c in "\\]^-[" else c for c in chars)


def _writable(value: str, excludes: Sequence[str]) -> str:
    if any(e in value for e in excludes):
        raise ToolFormatError(f"the constant {value!r} holds a marker and cannot be written raw")
    return value


def params_format(
    schema: Any,
    params: ParamSyntax,
    markers: Sequence[str],
    free: FreeText,
    raw_excludes: Sequence[str],
) -> Format:
    """The parameters of one call of a tool with parameter ``schema``: its declared
    parameters in order (required ones always, optional ones perhaps); for an object
    that declares none, any number of free-named parameters with JSON values."""
    props, free_form = object_properties(schema, schema)
    parts: list[Format] = []
    for p in props:
        part = seq(
            layout(params.key_begin + p.name + params.before_value(), markers),
            value_format(p.schema, schema, free, raw_excludes),
            layout(params.after_value(), markers),
        )
        parts.append(part if p.required else optional(part))
    if free_form:
        parts.append(
            star(
                seq(
                    layout(params.key_begin, markers),
                    regex(FREE_KEY_PATTERN),
                    layout(params.before_value(), markers),
                    json_value({}, free),
                    layout(params.after_value(), markers),
                )
            )
        )
    return seq(*parts)


def value_format(schema: Any, root: Any, free: FreeText, raw_excludes: Sequence[str]) -> Format:
    """A parameter value of ``schema`` as `value_kind` says it is written."""
    if value_kind(schema, root) is Kind.TEXT:
        return raw_text_format(schema, root, free, raw_excludes)
    return json_value(with_defs(schema, root), free)


def check_keys(format_name: str, schema: Any, forbidden: str) -> None:
    """Parameter names must be non-empty and hold none of ``forbidden``'s characters."""
    props, _ = object_properties(schema, schema)
    for p in props:
        if not p.name or p.name != p.name.strip() or any(c in p.name for c in forbidden):
            raise ToolFormatError(
                f"tool-call format {format_name!r} cannot carry the parameter name {p.name!r}"
            )


def hard_markers(syntax: CallSyntax, special: Sequence[str]) -> list[str]:
    """The call markers of ``syntax`` that are special tokens: the only markers read
    inside a JSON value's strings."""
    return [m for m in syntax.markers if m in special]


class XmlArgumentsFormat(ToolFormat):
    """A family whose calls are `CallSyntax` with parameters in `ParamSyntax` markup;
    the family file sets the class attributes.

    Raw values keep out every marker the parser ends a value at, and the family's
    special tokens (exactly: free-text exclusion is cheap to compile). Strings
    nested in JSON values keep out the special-token call markers, through
    ``nested_covers`` (JSON-string exclusion costs compile time per character)."""

    syntax: ClassVar[CallSyntax]
    params: ClassVar[ParamSyntax]
    parser_class: ClassVar[type[XmlParamsParser]] = XmlParamsParser
    #: short substrings of the special-token call markers (see the class docstring)
    nested_covers: ClassVar[tuple[str, ...]] = ()

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, api_name_ok, API_NAME_SYNTAX)
        syntax, markers = self.syntax, self.special_markers
        nested = FreeText.build(self.tokenizer, hard_markers(syntax, markers), self.nested_covers)
        raw = [
            *value_stops(syntax, self.params),
            *markers,
            *vocabulary_covers(self.tokenizer),
        ]
        calls = []
        for t in chosen:
            check_keys(self.name, t.schema, self.params.key_forbidden)
            args = params_format(t.schema, self.params, markers, nested, raw)
            calls.append(call_format(syntax, markers, t.name, args))
        many = parallel and named is None
        return structural_tag(calls_format(syntax, markers, calls, many=many))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None, forced: bool = False
    ) -> ToolCallParser:
        return self.parser_class(self, tools, named=named, forced=forced)

    @property
    def markup(self) -> Markup:
        return Markup((*self.syntax.markup, *self.params.markup), self.syntax.separator)
