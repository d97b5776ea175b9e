"""Python literal syntax for the pythonic format: the grammar of a value of a JSON
schema written as a Python literal, where a value written as Python text ends, and
its reading as JSON with the standard ``ast`` module (nothing is evaluated).

The grammar covers the common schema subset exactly: strings (as double-quoted
literals, with their enum, pattern, format and length), integers and numbers with
their bounds, booleans (``True``/``False``), null (``None``), enums and consts of any
JSON values, ``anyOf``/``oneOf``/type lists, arrays with their item bounds, objects
with declared properties (required ones always, written first; none: ``{}``), and
any dict for an object without ``properties``, arrays with ``prefixItems``. Anything
else (``allOf``, ``not``, ``if``...; the front end rewrites schemas without them, see
`structured_output.json_schemas`) falls back to any Python literal, which then may
not validate.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Sequence
from typing import Any

from .grammar import (
    NOT_TEXT,
    Format,
    FreeText,
    alt,
    any_text,
    const,
    json_value,
    optional,
    seq,
    star,
    tag,
)
from .json_text import dumps
from .schemas import object_properties, resolve

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_STRING_KEYWORDS = ("type", "enum", "const", "pattern", "format", "minLength", "maxLength")
_NUMBER_KEYWORDS = (
    "type",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
)


def any_literal(free: FreeText, start: str = "value") -> Format:
    """Any Python literal of JSON data: strings (without the barred characters, nor
    control characters or surrogates: a raw newline or NUL ends ``ast``'s reading, a
    NUL would let a sealed special token in, and a surrogate is no text), bounded
    numbers, True/False/None, lists, and dicts with string keys (``start`` "dict":
    only a dict)."""
    bar = "".join("\\" + c if c in "\\]^-[" else c for c in free.barred)
    grammar = rf"""root ::= {start}
value ::= string | number | "True" | "False" | "None" | list | dict
string ::= "'" char* "'"
char ::= [^'\\{NOT_TEXT}{bar}] | "\\" [\\'nrt]
number ::= "-"? ("0" | [1-9] [0-9]{{0,15}}) ("." [0-9]{{1,15}})?
list ::= "[" (value (", " value)*)? "]"
dict ::= "{{" (string ": " value (", " string ": " value)*)? "}}"
"""
    return {"type": "grammar", "grammar": grammar}


def python_string(free: FreeText) -> Format:
    """A string literal holding none of ``free``'s excludes: single-quoted without
    escapes (as Python's repr writes most strings), or double-quoted JSON (which
    Python reads the same, escapes included)."""
    single = tag("'", any_text(["'", "\\", "\n", "\r", "\x00", *free.excludes]), "'")
    return alt([single, json_value({"type": "string"}, free)])


def literal_format(schema: Any, root: Any, free: FreeText) -> Format:
    """A Python literal of a value of ``schema`` (see the module docstring)."""
    s = resolve(schema, root)
    if not isinstance(s, dict) or not s:
        return any_literal(free)
    if "const" in s:
        return const(repr(s["const"]))
    if "enum" in s:
        return alt(const(repr(v)) for v in s["enum"])
    for key in ("anyOf", "oneOf"):
        if key in s:
            return alt(literal_format(a, root, free) for a in s[key])
    t = s.get("type")
    if isinstance(t, list):
        return alt(literal_format({**s, "type": x}, root, free) for x in t)
    if t == "string":
        if not any(k in s for k in _STRING_KEYWORDS[1:]):
            return python_string(free)
        return json_value({k: s[k] for k in _STRING_KEYWORDS if k in s}, free)
    if t in ("integer", "number"):
        return json_value({k: s[k] for k in _NUMBER_KEYWORDS if k in s}, free)
    if t == "boolean":
        return alt([const("True"), const("False")])
    if t == "null":
        return const("None")
    if t == "array":
        return _array(s, root, free)
    if t == "object" and "properties" in s:  # only the declared ones (none: "{}")
        parts = []
        for p in object_properties(s, root)[0]:
            parts.append(
                (seq(const(repr(p.name) + ": "), literal_format(p.schema, root, free)), p.required)
            )
        return seq(const("{"), arguments(parts), const("}"))
    if t == "object":
        return any_literal(free, "dict")
    return any_literal(free)


def _array(s: dict[str, Any], root: Any, free: FreeText) -> Format:
    """A list: its ``prefixItems`` in order, then ``items`` (none if false), between
    ``minItems`` and ``maxItems`` of them."""
    prefix = [literal_format(p, root, free) for p in s.get("prefixItems") or ()]
    items = s.get("items", {})
    extra = None if items is False else literal_format(items, root, free)
    low = int(s.get("minItems", 0))
    cap = len(prefix) if extra is None else None
    if s.get("maxItems") is not None:
        cap = int(s["maxItems"]) if cap is None else min(cap, int(s["maxItems"]))
    if cap == 0:
        return const("[]")

    def element(i: int) -> Format:
        return prefix[i] if i < len(prefix) else extra  # type: ignore[return-value]

    fixed = cap if cap is not None else max(len(prefix), low, 1)
    tail: Format | None = None if cap is not None else star(seq(const(", "), element(fixed)))
    for i in reversed(range(max(low, 1), fixed)):
        more = seq(const(", "), element(i))
        tail = optional(more if tail is None else seq(more, tail))
    head = [element(0)] + [seq(const(", "), element(i)) for i in range(1, low)]
    body = seq(*head, *([tail] if tail is not None else []))
    return seq(const("["), body if low else optional(body), const("]"))


def arguments(parts: Sequence[tuple[Format, bool]], separator: str = ", ") -> Format:
    """The parts with ``separator`` between them: required ones (True) always, first,
    in order; optional ones perhaps, in order after them."""
    sep = const(separator)
    required = [p for p, r in parts if r]
    opts = [p for p, r in parts if not r]
    if required:
        body = [required[0]] + [seq(sep, p) for p in required[1:]]
        return seq(*body, *(optional(seq(sep, p)) for p in opts))
    if not opts:
        return const("")
    choices = []
    for i, first in enumerate(opts):
        choices.append(seq(first, *(optional(seq(sep, p)) for p in opts[i + 1 :])))
    return optional(alt(choices))


class PyExtent:
    """Finds where one Python value ends in text that arrives in pieces: before
    ``separator`` (one character), a ``)`` or a ``]`` outside brackets and strings.
    Strings may use either quote, tripled or not; a backslash escapes the next
    character."""

    __slots__ = ("_separator", "_depth", "_quote", "_escape")

    def __init__(self, separator: str = ",") -> None:
        self._separator = separator
        self._depth = 0
        self._quote = ""
        self._escape = False

    def feed(self, text: str, pos: int, final: bool) -> tuple[int, bool]:
        """Read ``text[pos:]``; return where reading stopped and whether the value
        ended there (the terminator is not read)."""
        i, n = pos, len(text)
        while i < n:
            c = text[i]
            if self._escape:
                self._escape = False
            elif self._quote:
                if c == "\\":
                    self._escape = True
                elif text.startswith(self._quote, i):
                    i += len(self._quote) - 1
                    self._quote = ""
                elif c == self._quote[0] and n - i < len(self._quote) and not final:
                    return i, False  # may be the start of a closing triple quote
            elif c in "'\"":
                if n - i < 3 and not final:
                    return i, False  # a triple quote cannot be told yet
                self._quote = c * 3 if text.startswith(c * 3, i) else c
                i += len(self._quote) - 1
            elif c in "([{":
                self._depth += 1
            elif c in ")]}":
                if self._depth == 0:
                    return i, True
                self._depth -= 1
            elif c == self._separator and self._depth == 0:
                return i, True
            i += 1
        return i, False


def literal_json(text: str) -> str:
    """The Python literal ``text`` as JSON text. Raises ValueError for anything that
    is not JSON data written as a literal (names, calls, operators, sets, bytes,
    complex or non-finite numbers, non-string dict keys)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escapes warn; they are still literals
        try:
            node = ast.parse(text.strip(), mode="eval").body
        except SyntaxError as e:
            raise ValueError(f"not a Python literal: {e.msg}") from None
    return _to_json(node, text.strip())


def _to_json(node: ast.AST, src: str) -> str:
    if isinstance(node, ast.Constant):
        v = node.value
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return dumps(v)
        if isinstance(v, int | float):
            return _number(node, src)
        raise ValueError(f"{type(v).__name__} is not JSON data")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = node.operand
        if isinstance(operand, ast.Constant) and isinstance(operand.value, int | float):
            if isinstance(operand.value, bool):
                raise ValueError("a sign before a boolean is not JSON data")
            number = _number(operand, src)
            return "-" + number if isinstance(node.op, ast.USub) else number
    if isinstance(node, ast.List | ast.Tuple):
        return "[" + ", ".join(_to_json(e, src) for e in node.elts) + "]"
    if isinstance(node, ast.Dict):
        items = []
        for k, v in zip(node.keys, node.values, strict=True):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                raise ValueError("dict keys must be strings")
            items.append(dumps(k.value) + ": " + _to_json(v, src))
        return "{" + ", ".join(items) + "}"
    raise ValueError(f"{type(node).__name__} is not a literal")


def _number(node: ast.Constant, src: str) -> str:
    """A number as written when that is JSON; otherwise its value, if finite."""
    written = ast.get_source_segment(src, node) or ""
    if _NUMBER.fullmatch(written):
        return written
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{written} is not a finite number")
    return repr(value) if isinstance(value, float) else str(value)
