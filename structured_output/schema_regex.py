"""JSON-schema ``pattern``s rewritten into the regex subset xgrammar enforces exactly.

xgrammar 0.2.9 matches a string's ``pattern`` against the raw text between the quotes
and can write no escape there. Read from its converter and checked by probing it:

- lookaheads are accepted and ignored (``^(?=.*\\d)[a-z\\d]{4}$`` gives ``"nilm"``);
  ``\\A`` and ``\\Z`` become the letters A and Z; lookbehinds, backreferences, ``\\b``,
  ``\\p{..}`` and inline flags are compile errors;
- a literal ``"`` or ``\\`` in the pattern is written raw, which ends the JSON string
  early (``^a"b$`` gives ``"a"b"``), and so is a literal control character (``\\t``);
- ``\\D`` and ``\\W`` admit non-ASCII digits and letters, ``\\S`` admits U+0085: the
  pattern's meaning in ECMA-262 (JSON Schema's regex dialect) differs from the meaning
  in Python's ``re`` (what ``jsonschema`` checks with), and xgrammar follows neither
  exactly;
- the whole string must match (JSON Schema asks only for a match somewhere in it): a
  subset of what the pattern allows, so every output is still valid.

`rewrite_pattern` parses a pattern, refuses the constructs above with an error that
says which, and writes it back with every character class spelled out as the
characters both dialects agree on, less those a JSON string cannot hold unescaped
(controls, quotes, backslashes, surrogates). Alternatives that need such a character
are dropped; a pattern left with none is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

MAX_CODE_POINT = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]


class PatternError(ValueError):
    """A pattern outside the subset (the message says which construct, and where)."""


# ----- sets of code points, as sorted disjoint inclusive ranges ------------------------


def _norm(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] <= r[1]):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _union(*sets: Ranges) -> Ranges:
    return _norm([r for s in sets for r in s])


def _complement(s: Ranges) -> Ranges:
    out, start = [], 0
    for lo, hi in s:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return tuple(out)


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return _complement(_union(_complement(a), _complement(b)))


def _chars(text: str) -> Ranges:
    return _norm([(ord(c), ord(c)) for c in text])


#: what a pattern-matched JSON string can hold: no control character, quote,
#: backslash (each needs an escape, which xgrammar cannot write there) or surrogate
WRITABLE = _complement(_norm([(0, 0x1F), (0xD800, 0xDFFF), (0x22, 0x22), (0x5C, 0x5C)]))

#: ECMA-262's classes (without the ``u`` flag, as JSON Schema uses them)
_ECMA = {
    "d": _norm([(0x30, 0x39)]),
    "w": _norm([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]),
    "s": _union(
        _chars("\t\n\v\f\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff"),
        ((0x2000, 0x200A),),
    ),
}
#: what ``.`` leaves out: ECMA's line terminators (Python's: only the newline)
_ECMA_LINE_ENDS = _chars("\n\r\u2028\u2029")


#: Python's ``\\s`` on str patterns (what ``str.isspace`` holds)
PYTHON_SPACE = _union(
    _chars("\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"),
    ((0x2000, 0x200A),),
)


@cache
def python_class(letter: str) -> Ranges:
    """Python's ``\\d``, ``\\w`` or ``\\s`` on str patterns (Unicode), computed once (half a
    second: only a negated ``\\d`` or ``\\w`` needs it)."""
    text = "".join(map(chr, range(MAX_CODE_POINT + 1)))
    return _norm([(m.start(), m.end() - 1) for m in re.finditer(f"\\{letter}+", text)])


class _Set:
    """A class both dialects read: ``sure`` holds the characters both put in it,
    ``maybe`` those either does (computed when a negation needs it); a negation swaps
    and complements them."""

    __slots__ = ("sure", "_maybe")

    def __init__(self, sure: Ranges, maybe: Ranges | Callable[[], Ranges]) -> None:
        self.sure = sure
        self._maybe = maybe

    @property
    def maybe(self) -> Ranges:
        if callable(self._maybe):
            self._maybe = self._maybe()
        return self._maybe

    def negated(self) -> _Set:
        sure = self.sure
        return _Set(_complement(self.maybe), lambda: _complement(sure))


def _exact(s: Ranges) -> _Set:
    return _Set(s, s)


def _shorthand(letter: str) -> _Set:
    base = letter.lower()
    ecma = _ECMA[base]
    if base == "s":
        s = _Set(_intersect(ecma, PYTHON_SPACE), _union(ecma, PYTHON_SPACE))
    else:  # ECMA's digits and word characters are a subset of Python's
        s = _Set(ecma, lambda: _union(ecma, python_class(base)))
    return s.negated() if letter.isupper() else s


def _dot() -> _Set:
    everything = ((0, MAX_CODE_POINT),)
    return _Set(_complement(_ECMA_LINE_ENDS), _intersect(everything, _complement(_chars("\n"))))


# ----- the syntax tree -------------------------------------------------------------------


@dataclass(slots=True)
class _Chars:
    chars: Ranges


@dataclass(slots=True)
class _Seq:
    items: list


@dataclass(slots=True)
class _Alt:
    options: list


@dataclass(slots=True)
class _Repeat:
    node: object
    low: int
    high: int | None


_EMPTY = _Seq([])

_CONTROL_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_REFUSED_ESCAPES = {
    "b": "the word boundary \\b",
    "B": "the word boundary \\B",
    "A": "the anchor \\A",
    "Z": "the anchor \\Z",
    "z": "the anchor \\z",
    "G": "the anchor \\G",
    "p": "the Unicode property class \\p{...}",
    "P": "the Unicode property class \\P{...}",
    "k": "the named backreference \\k<...>",
    "c": "the control escape \\c",
    "N": "the named character \\N{...}",
}
_QUANT = re.compile(r"\{(\d+)(,(\d*))?\}")
#: repetition counts above this are refused (xgrammar expands counts into states)
MAX_REPEAT = 1000


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0

    def fail(self, what: str, at: int | None = None) -> PatternError:
        return PatternError(f"{what} at position {(self.i if at is None else at) + 1}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.p[j] if j < len(self.p) else ""

    def parse(self) -> object:
        node = self.alternation(top=True)
        if self.i < len(self.p):
            raise self.fail("an unmatched ')'")
        return node

    def alternation(self, top: bool = False) -> object:
        options = [self.sequence(top)]
        while self.peek() == "|":
            self.i += 1
            options.append(self.sequence(top))
        return options[0] if len(options) == 1 else _Alt(options)

    def sequence(self, top: bool) -> object:
        items: list = []
        start = self.i
        while self.i < len(self.p) and self.peek() not in "|)":
            c = self.peek()
            if c == "^":
                if not (top and self.i == start):
                    raise self.fail("the anchor ^ somewhere other than the start")
                self.i += 1
                continue
            if c == "$":
                self.i += 1
                if not (top and self.peek() in ("", "|")):
                    raise self.fail("the anchor $ somewhere other than the end", self.i - 1)
                continue
            atom = self.atom()
            items.append(self.quantified(atom))
        return items[0] if len(items) == 1 else _Seq(items)

    def quantified(self, atom: object) -> object:
        c = self.peek()
        low: int
        high: int | None
        if c in ("*", "+", "?"):
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            self.i += 1
        elif c == "{" and (m := _QUANT.match(self.p, self.i)):
            low = int(m.group(1))
            high = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if high is not None and high < low:
                raise self.fail("a repetition {n,m} with m < n")
            if max(low, high or 0) > MAX_REPEAT:
                raise self.fail(f"a repetition count over {MAX_REPEAT}")
            self.i = m.end()
        else:
            return atom
        if self.peek() == "?":  # lazy: the same strings
            self.i += 1
        elif self.peek() == "+":
            raise self.fail("a possessive quantifier")
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and _QUANT.match(self.p, self.i)):
            raise self.fail("two quantifiers in a row")
        return _Repeat(atom, low, high)

    def atom(self) -> object:
        c = self.peek()
        if c == "(":
            return self.group()
        if c == "[":
            return _Chars(self.char_class())
        if c == ".":
            self.i += 1
            return _Chars(_dot().sure)
        if c == "\\":
            s = self.escape(in_class=False)
            return _Chars(s.sure)
        if c in "*+?":
            raise self.fail(f"a quantifier {c!r} with nothing to repeat")
        self.i += 1
        return _Chars(_chars(c))

    def group(self) -> object:
        start = self.i
        self.i += 1
        if self.peek() == "?":
            head = self.p[self.i : self.i + 3]
            if head.startswith("?:"):
                self.i += 2
            elif head.startswith("?P<") or (head.startswith("?<") and head[2:3] not in "=!"):
                end = self.p.find(">", self.i)
                if end < 0:
                    raise self.fail("an unfinished group name")
                self.i = end + 1
            elif head[:2] in ("?=", "?!"):
                raise self.fail("a lookahead", start)
            elif head.startswith("?<"):
                raise self.fail("a lookbehind", start)
            elif head.startswith("?P="):
                raise self.fail("a backreference", start)
            elif head.startswith("?>"):
                raise self.fail("an atomic group", start)
            elif head.startswith("?("):
                raise self.fail("a conditional group", start)
            else:
                raise self.fail("an inline flag group", start)
        node = self.alternation()
        if self.peek() != ")":
            raise self.fail("an unclosed '('", start)
        self.i += 1
        return node

    def escape(self, in_class: bool) -> _Set:
        at = self.i
        self.i += 1
        c = self.peek()
        if not c:
            raise self.fail("a trailing backslash", at)
        self.i += 1
        if c in "dDwWsS":
            return _shorthand(c)
        if in_class and c == "b":  # backspace, in a class
            return _exact(_chars("\b"))
        if c.isdigit() and c != "0":
            raise self.fail("a backreference", at)
        if c in _REFUSED_ESCAPES:
            raise self.fail(_REFUSED_ESCAPES[c], at)
        if c in _CONTROL_ESCAPES:
            return _exact(_chars(_CONTROL_ESCAPES[c]))
        if c in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[c]
            digits = self.p[self.i : self.i + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"an unfinished \\{c} escape", at)
            self.i += width
            code = int(digits, 16)
            if code > MAX_CODE_POINT:
                raise self.fail(f"the escape \\{c}{digits} beyond U+10FFFF", at)
            return _exact(((code, code),))
        if c.isalnum():
            raise self.fail(f"the unknown escape \\{c}", at)
        return _exact(_chars(c))

    def char_class(self) -> Ranges:
        start = self.i
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        parts: list[_Set] = []
        first = True
        while True:
            c = self.peek()
            if not c:
                raise self.fail("an unclosed '['", start)
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "[" and self.peek(1) in (":", "=", "."):
                raise self.fail("a POSIX class or nested set")
            item = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                end = self.class_atom()
                lo, hi = _single(item), _single(end)
                if lo is None or hi is None:
                    raise self.fail("a range with a class at one end")
                if hi < lo:
                    raise self.fail("a range out of order")
                parts.append(_exact(((lo, hi),)))
            else:
                parts.append(item)
        s = _Set(_union(*(p.sure for p in parts)), lambda: _union(*(p.maybe for p in parts)))
        return (s.negated() if negate else s).sure

    def class_atom(self) -> _Set:
        if self.peek() == "\\":
            return self.escape(in_class=True)
        c = self.peek()
        self.i += 1
        return _exact(_chars(c))


def _single(s: _Set) -> int | None:
    if len(s.sure) == 1 and s.sure[0][0] == s.sure[0][1] and s.maybe == s.sure:
        return s.sure[0][0]
    return None


# ----- pruning and writing back -------------------------------------------------------------


def _prune(node: object) -> object | None:
    """``node`` without what no writable text matches; None when nothing is left."""
    if isinstance(node, _Chars):
        kept = _intersect(node.chars, WRITABLE)
        return _Chars(kept) if kept else None
    if isinstance(node, _Seq):
        items = []
        for item in node.items:
            p = _prune(item)
            if p is None:
                return None
            if p is not _EMPTY:
                items.append(p)
        return _Seq(items) if items else _EMPTY
    if isinstance(node, _Alt):
        options = [p for p in map(_prune, node.options) if p is not None]
        if not options:
            return None
        return options[0] if len(options) == 1 else _Alt(options)
    if isinstance(node, _Repeat):
        inner = _prune(node.node)
        if inner is None or inner is _EMPTY:
            return _EMPTY if node.low == 0 or inner is _EMPTY else None
        return _Repeat(inner, node.low, node.high)
    raise TypeError(node)


_SPECIAL = set("\\^$.|?*+()[]{}-/")


def _char(code: int) -> str:
    c = chr(code)
    return "\\" + c if c in _SPECIAL else c


def _write(node: object) -> str:
    if isinstance(node, _Chars):
        r = node.chars
        if len(r) == 1 and r[0][0] == r[0][1]:
            return _char(r[0][0])
        body = "".join(
            _char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in node.chars
        )
        return f"[{body}]"
    if isinstance(node, _Seq):
        return "".join(_group(i) if isinstance(i, _Alt) else _write(i) for i in node.items)
    if isinstance(node, _Alt):
        return "|".join(_write(o) for o in node.options)
    if isinstance(node, _Repeat):
        inner = node.node
        simple = isinstance(inner, _Chars)
        body = _write(inner) if simple else _group(inner)
        if (node.low, node.high) == (0, None):
            return body + "*"
        if (node.low, node.high) == (1, None):
            return body + "+"
        if (node.low, node.high) == (0, 1):
            return body + "?"
        if node.high is None:
            return f"{body}{{{node.low},}}"
        if node.low == node.high:
            return f"{body}{{{node.low}}}"
        return f"{body}{{{node.low},{node.high}}}"
    raise TypeError(node)


def _group(node: object) -> str:
    return f"(?:{_write(node)})"


def _lengths(node: object) -> tuple[int, int | None]:
    """The fewest and most characters ``node`` matches (None: no most)."""
    if isinstance(node, _Chars):
        return 1, 1
    if isinstance(node, _Seq):
        spans = [_lengths(i) for i in node.items]
        highs = [h for _, h in spans]
        return sum(lo for lo, _ in spans), None if None in highs else sum(highs)  # type: ignore[arg-type]
    if isinstance(node, _Alt):
        spans = [_lengths(o) for o in node.options]
        highs = [h for _, h in spans]
        return min(lo for lo, _ in spans), None if None in highs else max(highs)  # type: ignore[type-var]
    if isinstance(node, _Repeat):
        lo, hi = _lengths(node.node)
        most = None if hi is None or node.high is None else hi * node.high
        return lo * node.low, most
    raise TypeError(node)


@cache
def _rewrite(pattern: str) -> tuple[str, int, int | None]:
    tree = _Parser(pattern).parse()
    pruned = _prune(tree)
    if pruned is None:
        raise PatternError(
            "it matches only text holding quotes, backslashes or control characters, "
            "which a JSON string holds only escaped"
        )
    return (f"^{_write(pruned)}$", *_lengths(pruned))


def rewrite_pattern(pattern: str) -> str:
    """``pattern`` in the subset xgrammar enforces exactly (full match, character
    classes spelled out); `PatternError` names a construct outside it."""
    return _rewrite(pattern)[0]


def pattern_lengths(pattern: str) -> tuple[int, int | None]:
    """The fewest and most characters a string of the rewritten ``pattern`` has."""
    _, low, high = _rewrite(pattern)
    return low, high
