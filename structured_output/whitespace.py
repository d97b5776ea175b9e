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
