"""Where a constraint's whitespace bound is kept: by the guard (`guard.py`), or by
its grammar.

The guard counts whitespace outside JSON strings by lexing the output as JSON, which
is exact when everything the constraint writes outside its JSON values is JSON-neutral
text: literals whose quotes balance, and tokens. Such a constraint is *JSON text*; it
is compiled with xgrammar's unbounded whitespace, and the guard bounds it. A
structural tag that holds free text (``any_text``, a regex that may write a quote, a
backslash or whitespace, an EBNF grammar, XML-style values) is not: the guard reads it
as raw text, and its JSON values carry the bound in their grammar
(``max_whitespace_cnt``), which costs more per fill but is exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

#: structural-tag formats whose text is a JSON value, a literal, or built of others
_COMPOSITE = frozenset(
    {"sequence", "or", "tag", "tags_with_separator", "optional", "plus", "star", "repeat"}
)
#: a regex whose every character is JSON-neutral: no quote, backslash or whitespace
#: can match it (no escapes, no dot, no negated class, ranges checked apart)
_NEUTRAL_REGEX = re.compile(r"[A-Za-z0-9_:;=@#%&!<>/+*?|(){},\[\]$^-]*")
_RANGE = re.compile(r"(.)-(.)")
_NOT_NEUTRAL = frozenset(b' \t\n\r"\\')


def json_text(fmt: Any) -> bool:
    """Whether a structural tag's format (or a piece of one) writes JSON text only."""
    if isinstance(fmt, str):
        return _neutral_literal(fmt)
    if not isinstance(fmt, dict):
        return False
    kind = fmt.get("type")
    if kind == "structural_tag":
        return json_text(fmt.get("format"))
    if kind == "json_schema":
        return fmt.get("style", "json") == "json"
    if kind == "const_string":
        return _neutral_literal(fmt.get("value", ""))
    if kind == "token":
        return True
    if kind == "regex":
        return _neutral_regex(fmt.get("pattern", ""))
    if kind not in _COMPOSITE:
        return False
    if kind == "tag":
        parts = [fmt.get("begin"), fmt.get("content"), fmt.get("end")]
    elif kind in ("sequence", "or"):
        parts = list(fmt.get("elements", []))
    elif kind == "tags_with_separator":
        parts = [*fmt.get("tags", []), fmt.get("separator", "")]
        if fmt.get("end") is not None:
            parts.append(fmt["end"])
    else:
        parts = [fmt.get("content")]
    return all(json_text(p) for p in parts)


def bound_in_grammar(fmt: Any, limit: int | None) -> Any:
    """``fmt`` with ``max_whitespace_cnt = limit`` on each JSON value that sets none."""
    if limit is None:
        return fmt
    if isinstance(fmt, list):
        return [bound_in_grammar(v, limit) for v in fmt]
    if not isinstance(fmt, dict):
        return fmt
    if fmt.get("type") == "json_schema":
        if fmt.get("max_whitespace_cnt") is None:
            return {**fmt, "max_whitespace_cnt": limit}
        return fmt
    return {k: bound_in_grammar(v, limit) for k, v in fmt.items()}


def _neutral_literal(text: str) -> bool:
    """A literal that starts and ends outside a JSON string (its quotes balance)."""
    inside = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif inside and ch == "\\":
            escaped = True
        elif ch == '"':
            inside = not inside
    return not inside


def _neutral_regex(pattern: str) -> bool:
    if not _NEUTRAL_REGEX.fullmatch(pattern) or "[^" in pattern:
        return False
    for lo, hi in _RANGE.findall(pattern):
        if any(ord(lo) <= c <= ord(hi) for c in _NOT_NEUTRAL):
            return False
    return True


# ----- raw control characters in a compiled JSON grammar's strings ------------------

_ESCAPES = {"0": 0, "a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, "e": 27}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_CONTROL = 0x1F
_WHITESPACE = frozenset((0x09, 0x0A, 0x0D))


def _class_ranges(body: str) -> list[tuple[int, int]]:
    """The code point ranges of a class body of xgrammar's EBNF (``^`` left off). A
    malformed escape raises ValueError."""
    points: list[int | None] = []  # None: the dash of a range
    i = 0
    while i < len(body):
        c, i = body[i], i + 1
        if c == "\\" and i < len(body):
            e = body[i]
            k = _HEX_DIGITS.get(e, 0)
            points.append(int(body[i + 1 : i + 1 + k], 16) if k else _ESCAPES.get(e, ord(e)))
            i += 1 + k
        elif c == "-" and points and points[-1] is not None and i < len(body):
            points.append(None)
        else:
            points.append(ord(c))
    ranges: list[tuple[int, int]] = []
    k = 0
    while k < len(points):
        lo = points[k]
        if k + 2 < len(points) and points[k + 1] is None and lo is not None:
            hi = points[k + 2]
            ranges.append((lo, ord("-") if hi is None else hi))
            k += 3
        else:
            lo = ord("-") if lo is None else lo
            ranges.append((lo, lo))
            k += 1
    return ranges


def _classes(ebnf: str) -> Iterator[str]:
    """The character classes of an EBNF text (``[...]``, ``[^...]``), quoted literals
    skipped."""
    i, n = 0, len(ebnf)
    while i < n:
        c = ebnf[i]
        if c in '"[':
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < n and ebnf[j] != close:
                j += 2 if ebnf[j] == "\\" else 1
            if c == "[":
                yield ebnf[i + 1 : j]
            i = j + 1
        else:
            i += 1


def refuses_control(ebnf: str) -> bool:
    """Whether a JSON grammar, as xgrammar prints it, writes no raw control character
    inside its strings by itself, so that the guard need not mask them.

    xgrammar's JSON strings are a character class that leaves out ``\\0-\\x1f``;
    its length-bounded ones (``maxLength``, ``minLength``) and its regexes (``pattern``,
    ``patternProperties``) do not. So: no regex, every negated class leaves the range
    out, and no other class names a control character but whitespace (``[ \\n\\r\\t]``
    between values, where it is not in a string). Conservative: what it cannot tell
    is masked."""
    if "Regex(" in ebnf:
        return False
    try:
        return all(_class_refuses_control(body) for body in _classes(ebnf))
    except ValueError:  # an escape it cannot read
        return False


def _class_refuses_control(body: str) -> bool:
    """Whether a class of a JSON grammar lets no control character into a string: a
    negated one leaves them all out, another names none but whitespace."""
    if body.startswith("^"):
        left_out = set()
        for lo, hi in _class_ranges(body[1:]):
            left_out.update(range(lo, min(hi, _CONTROL) + 1))
        return len(left_out) == _CONTROL + 1
    return not any(
        lo <= _CONTROL and not (lo == hi and lo in _WHITESPACE) for lo, hi in _class_ranges(body)
    )
