"""Masks kept inside a free JSON string: a fill skipped where it could only repeat.

Inside a JSON string with no limit on its text (no length, pattern, format or enum),
xgrammar's matcher stands at the start of a *self-loop rule*: one alternative reads a
character of a class and then the rule again, each other begins with a literal
character outside that class (the closing quote, a backslash; in a structural tag, the
first character of an end tag that strings must not contain)::

    basic_string_sub ::= (("\\"") | ([^\\0-\\x1f\\"\\\\\\r\\n] basic_string_sub)
                          | ("\\\\" basic_escape basic_string_sub))

A token made only of whole characters of that class and none of those literals' first
characters (the rule's *plain* tokens, `PlainTables`) leads from the rule's start back
to it, with the same rules waiting for the string's end: what may follow is the same,
and so is the mask. Most tokens of a string's text are plain, and a fill inside a
string is among the costliest (every token with a quote is checked against what may
follow the string).

So a matcher (`guard.GuardedMatcher`), after a fill that follows a token not plain
(an opening quote, an escape: where a string may begin or resume), reads its parser
states once (`KeptStrings.check`). Where all stand at the start of a self-loop rule
(one, or several side by side: in xgrammar's grammar for any JSON, an object's string
value is read by two rules at once, one ending before a comma, one before a brace),
the row's mask is kept, and while only tokens plain in all those rules follow, later
fills copy it instead of asking xgrammar. Any other token, a rollback or a reset drops
it.

Within one such string, the masks where its text is mid-escape (after a backslash,
in a ``\\u`` escape's digits, where xgrammar checks thousands of tokens one by one) are
the same at every escape: the same points, the same rules waiting for the string's
end. So a JSON matcher keeps a *memo* from its string's first check until its lexer
sees the string end: a fill there reads the points, and copies the mask filled at the
same points before in the same string (`memo_key`).

The rules are read from the compiled grammar's text (rule ``i`` is its line ``i``),
and a rule's start is told from its other points by stepping a fork of the matcher
over one plain character, once per grammar and set of points: at the starts (and only
there) that character leads back to the same points. Where any of this cannot be read
(an xgrammar that prints grammars or states otherwise), nothing is kept.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .escape_masks import (
    AFTER_BACKSLASH,
    EscapeCache,
    EscapeTables,
    RuleClass,
    escape_kind,
    escape_rules,
    in_class,
)

_STATE = re.compile(
    r"ParserState\(rule_id=(-?\d+), sequence_id=-?\d+, element_id=(-?\d+), "
    r"rule_start_pos=-?\d+, sub_element_id=(-?\d+)\)"
)
_ESCAPES = {"n": 10, "r": 13, "t": 9, "0": 0, "b": 8, "f": 12, "v": 11}
#: ASCII characters tried, in turn, to tell a rule's start (none ends a JSON string or
#: begins what follows one)
_PROBES = "qxzQXZkKjJ"

Ranges = tuple[tuple[int, int], ...]
#: xgrammar's rule for a JSON string's text, as it prints it
_JSON_STRING_RULE = (
    r'basic_string_sub ::= (("\"") | ([^\0-\x1f\"\\\r\n] basic_string_sub) '
    r'| ("\\" basic_escape basic_string_sub))'
)


# ----- reading the grammar's text ------------------------------------------------------


def _char(text: str, i: int) -> tuple[int, int]:
    """The code point written at ``text[i]`` (an escape or a character) and the index
    after it."""
    if text[i] != "\\":
        return ord(text[i]), i + 1
    c = text[i + 1]
    for lead, width in (("x", 2), ("u", 4), ("U", 8)):
        if c == lead:
            return int(text[i + 2 : i + 2 + width], 16), i + 2 + width
    return _ESCAPES.get(c, ord(c)), i + 2


def _char_class(text: str) -> tuple[Ranges, bool]:
    """``[...]`` -> its ranges and whether it is negated."""
    body, negated, ranges = text[1:-1], False, []
    i = 0
    if body.startswith("^"):
        negated, i = True, 1
    while i < len(body):
        lo, i = _char(body, i)
        hi = lo
        if i + 1 < len(body) and body[i] == "-":
            hi, i = _char(body, i + 1)
        ranges.append((lo, hi))
    return tuple(ranges), negated


def _split_alternatives(body: str) -> list[str] | None:
    """``((a) | (b) | ...)`` -> ``["a", "b", ...]``; None where it is not that form."""
    if not (body.startswith("((") and body.endswith("))")):
        return None
    parts, depth, start, i = [], 0, 1, 1
    inside = None  # '"' or '[' while in a literal or a class
    while i < len(body) - 1:
        c = body[i]
        if c == "\\" and inside:
            i += 2
            continue
        if inside:
            if (inside == '"' and c == '"') or (inside == "[" and c == "]"):
                inside = None
        elif c in '"[':
            inside = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                parts.append(body[start + 1 : i])
        elif c == "|" and depth == 0:
            start = i + 2
        i += 1
    return parts if depth == 0 and inside is None else None


_RULE = re.compile(r"^(?P<name>\S+) ::= (?P<body>\(\(.*\)\))(?: \(=.*\))?$")
_LOOP = re.compile(r"^(?P<cls>\[(?:\\.|[^\]\\])*\]) (?P<name>\S+)$")
_LITERAL = re.compile(r'^"(?P<first>\\(?:x..|u....|U........|.)|[^"\\])')


def self_loop_rules(grammar_text: str) -> dict[int, tuple[Ranges, bool, frozenset[int]]]:
    """Rule id -> (class ranges, negated, first characters of its other alternatives)
    for each self-loop rule of a grammar's text (``str(grammar)``)."""
    rules = {}
    for rule_id, line in enumerate(grammar_text.split("\n")):
        found = _RULE.match(line)
        alternatives = _split_alternatives(found["body"]) if found else None
        if not alternatives:
            continue
        loop, firsts = None, set()
        for alt in alternatives:
            own = _LOOP.match(alt)
            if own is not None and own["name"] == found["name"] and loop is None:
                loop = own["cls"]
                continue
            literal = _LITERAL.match(alt)
            if literal is None:  # something else may begin here: not one we can keep
                loop = None
                break
            firsts.add(_char(literal["first"], 0)[0])
        if loop is not None:
            ranges, negated = _char_class(loop)
            rules[rule_id] = (ranges, negated, frozenset(firsts))
    return rules


# ----- the plain tokens of a vocabulary ------------------------------------------------


class PlainTables:
    """Per self-loop rule (its class and its other alternatives' first characters):
    ``1`` per token id whose bytes are whole UTF-8 characters, each in the class and
    none a first character; ``0`` for the rest (special tokens, partial characters,
    ids past the vocabulary). Built once per distinct rule and kept."""

    def __init__(self, token_bytes: Sequence[bytes], vocab_rows: int) -> None:
        self._bytes, self.vocab_rows = token_bytes, vocab_rows
        self._chars: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._tables: dict[Any, bytes] = {}
        self._lock = threading.Lock()
        self._escapes = EscapeCache()
        #: every token is plain: a grammar with no self-loop rule never checks
        self.every = b"\x01" * vocab_rows
        #: one-character tokens that every free string allows: a row whose mask
        #: refuses one is not at a string's start, and its states are not read
        self.probe_ids = [i for i, b in enumerate(token_bytes[:vocab_rows]) if b in (b"q", b"Z")]
        #: the same, as (word, bit) of a row of uint32 words
        self.probe_bits = [(i >> 5, 1 << (i & 31)) for i in self.probe_ids]

    def warm(self) -> None:
        """Build what the first grammar with JSON strings would (the vocabulary's code
        points, the table of xgrammar's JSON string rule), off the engine's step."""
        rules = list(self_loop_rules(_JSON_STRING_RULE).values())
        for rule in rules:
            self.table(*rule)
        self.escape_tables(rules)

    def escape_tables(self, rules: Sequence[RuleClass]) -> EscapeTables:
        """The `EscapeTables` of strings read by ``rules`` side by side."""
        return self._escapes.get(self._bytes, self.vocab_rows, self._code_points, rules)

    def _code_points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every whole-UTF-8 token's code points, concatenated, where each token's begin,
        and which tokens those are."""
        if self._chars is None:
            points: list[int] = []
            starts, ids = [], []
            for i, data in enumerate(self._bytes[: self.vocab_rows]):
                if not data:
                    continue
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                starts.append(len(points))
                ids.append(i)
                points.extend(map(ord, text))
            self._chars = (
                np.asarray(points, dtype=np.int64),
                np.asarray(starts, dtype=np.int64),
                np.asarray(ids, dtype=np.int64),
            )
        return self._chars

    def table(self, ranges: Ranges, negated: bool, firsts: frozenset[int]) -> bytes:
        key = (ranges, negated, firsts)
        with self._lock:
            found = self._tables.get(key)
            if found is not None:
                return found
            points, starts, ids = self._code_points()
            inside, _ = in_class(points, key)
            flags = np.zeros(self.vocab_rows, dtype=np.uint8)
            if len(starts):
                flags[ids] = np.logical_and.reduceat(inside, starts)
            found = self._tables[key] = flags.tobytes()
            return found


# ----- per grammar ---------------------------------------------------------------------


class KeptStrings:
    """What one compiled grammar lets its matchers keep: its self-loop rules, their
    plain-token tables (from the vocabulary's `PlainTables`), and which sets of parser
    points were found to be starts of such rules."""

    def __init__(self, grammar_text: str, plain: PlainTables) -> None:
        self.rules = self_loop_rules(grammar_text)
        self.plain = plain
        self._tables: dict[Any, bytes] = {}
        #: parser points as printed ((rule, point, sub) per state) -> the table of the
        #: tokens plain in every rule when each point is its rule's start, else None
        self._verdicts: dict[tuple[tuple[str, str, str], ...], bytes | None] = {}
        #: the same points, where they are starts: of which rules
        self.starts_of: dict[tuple[tuple[str, str, str], ...], frozenset[int]] = {}
        #: the rules that are JSON's escape rule, and the kind of point mid-escape
        #: (`escape_masks.escape_kind`) of parser points found in one, or None
        self.escapes = escape_rules(grammar_text, _char_class)
        self._kinds: dict[tuple[Any, frozenset[int]], tuple[int, EscapeTables] | None] = {}
        #: ``0`` for a token after which a check is worth it: one that is plain in no
        #: self-loop rule (a quote, an escape), where a string may begin or resume
        self.any_plain = self._union() if self.rules else plain.every

    def warm(self) -> None:
        """Build the tables a matcher of this grammar may need inside its strings (each
        self-loop rule's plain tokens and, where the grammar has JSON escapes, each
        string class's `EscapeTables`), so that its first strings do not build them on
        the engine's step; each is built once per vocabulary and class."""
        for rule in self.rules:
            self.table(rule)
            if self.escapes:
                self.plain.escape_tables([self.rules[rule]])

    def _union(self) -> bytes:
        tables = [np.frombuffer(self.table(r), dtype=np.uint8) for r in self.rules]
        return np.bitwise_or.reduce(tables).tobytes()

    def table(self, rule: int) -> bytes:
        found = self._tables.get(rule)
        if found is None:
            found = self._tables[rule] = self.plain.table(*self.rules[rule])
        return found

    def common_table(self, rules: frozenset[int]) -> bytes:
        """The tokens plain in every one of ``rules``."""
        if len(rules) == 1:
            return self.table(next(iter(rules)))
        found = self._tables.get(rules)
        if found is None:
            tables = [np.frombuffer(self.table(r), dtype=np.uint8) for r in sorted(rules)]
            found = self._tables[rules] = np.bitwise_and.reduce(tables).tobytes()
        return found

    def check(self, matcher: Any, found: tuple | None = None) -> bytes | None:
        """Where every parser state of ``matcher`` stands at the start of a self-loop
        rule (one rule, or several side by side: xgrammar's JSON object values end
        either before a comma or before a brace), the table of tokens plain in all of
        them; else None. ``found``: its states as read already (`memo_key`)."""
        if found is None:
            found = tuple(_STATE.findall(_state(matcher)))  # (rule, point, sub) as printed
        try:
            return self._verdicts[found]
        except KeyError:
            verdict = self._verdicts[found] = self._verdict(matcher, found)
            return verdict

    def escape_kind(
        self, matcher: Any, found: tuple[tuple[str, str, str], ...], rules: frozenset[int]
    ) -> tuple[int, EscapeTables] | None:
        """The kind of point mid-escape (`escape_masks.escape_kind`) of ``found``,
        ``matcher``'s parser points, in a string read by ``rules``, and the tables of
        those rules: None unless it stands in a rule of `escapes` alone, and the
        escape, once complete, leads back to the starts of ``rules``. Found once per
        grammar, points and rules."""
        try:
            return self._kinds[found, rules]
        except KeyError:
            kind = None
            points = _points(found)
            if points and len(points) == 1 and next(iter(points))[0] in self.escapes:
                kind = escape_kind(matcher.fork)
            if kind is not None:
                fork = matcher.fork()
                fork.accept_string("n" if kind == AFTER_BACKSLASH else "0" * kind)
                back = tuple(_STATE.findall(_state(fork)))
                if self.check(fork, back) is None or self.starts_of.get(back) != rules:
                    kind = None
            tables = None
            if kind is not None:
                tables = (kind, self.plain.escape_tables([self.rules[r] for r in rules]))
            self._kinds[found, rules] = tables
            return tables

    def _verdict(self, matcher: Any, found: tuple[tuple[str, str, str], ...]) -> bytes | None:
        points = _points(found)
        if not points:
            return None
        rules = frozenset(r for r, _ in points)
        if not rules <= self.rules.keys():
            return None
        table = self.common_table(rules)
        c = self._probe_char(rules)
        if c is None:  # no character is plain in all: nothing is kept here
            return None
        # From each rule's start one plain character leads back to it, the rules waiting
        # alike; from within a character, or past a rule's end, it does not.
        fork = matcher.fork()  # a plain xgrammar matcher of the same state
        if not fork.accept_string(c) or _points(tuple(_STATE.findall(_state(fork)))) != points:
            return None
        self.starts_of[found] = rules
        return table

    def _probe_char(self, rules: frozenset[int]) -> str | None:
        """An ASCII character plain in every one of ``rules``."""
        for c in _PROBES:
            for rule in rules:
                ranges, negated, firsts = self.rules[rule]
                inside = any(lo <= ord(c) <= hi for lo, hi in ranges) != negated
                if not inside or ord(c) in firsts:
                    break
            else:
                return c
        return None


def _points(found: tuple[tuple[str, str, str], ...]) -> frozenset[tuple[int, int]] | None:
    """The (rule, point) pairs of parser states as printed; None where one stands
    within an element (a character's bytes, a literal's)."""
    if not found or any(sub != "0" for _, _, sub in found):
        return None
    return frozenset((int(r), int(p)) for r, p, _ in found)


def _state(matcher: Any) -> str:
    import xgrammar as xgr

    return xgr.GrammarMatcher._debug_print_internal_state(matcher)


def keep_if_free(matcher: Any, view: np.ndarray, row: int, found: tuple | None = None) -> None:
    """After ``matcher``'s fill into ``view[row]`` (uint32), where it asked for a check
    (``probe``): keep the row when its states stand at a self-loop rule's start.
    ``matcher`` is a `guard.GuardedMatcher`; its lexer tells whether it may be inside a
    string at all, and the row whether a free string's characters are allowed, before
    its states are read (``found``: as read already, by `memo_key`)."""
    matcher.probe = 0
    su = matcher.guard_state // matcher._k
    if su != matcher._check_at:  # mid-escape or mid-character: after the next token
        matcher.rearm = matcher.guard.mid_text[su]
        return
    words = view[row]
    kept = matcher._kept
    for w, bit in kept.plain.probe_bits:
        if not words.item(w) & bit:  # a string with a limit, or inside a ``\u`` escape
            matcher.rearm = 1  # (which the guard's lexer does not follow): look again
            return
    matcher.rearm = 0
    if found is None:
        found = tuple(_STATE.findall(_state(matcher)))
    table = kept.check(matcher, found)
    if table is None:
        return
    if matcher.kept is None:
        matcher.kept = np.empty_like(words)
    np.copyto(matcher.kept, words)
    matcher.keep = 1
    matcher._table = table
    if matcher.guard_lexes_strings:
        # this string's masks mid-escape, until its lexer leaves it; its start's too,
        # where each escape leads back (to these points, or to others found before to
        # be starts of the same rules: `memo_hit`)
        if matcher.memo is None:
            matcher.memo = {}
        at = ("start", kept.starts_of[found])
        start = matcher.memo.get(at)
        if start is None:
            start = matcher.memo[at] = words.copy()
            # the string's start, for its masks mid-escape (`_mid_escape`): none where
            # starts of other rules were found in it too
            first = matcher.memo.setdefault("start", at)
            if first != at:
                matcher.memo["start"] = None
        matcher.memo.setdefault(found, start)


def memo_key(matcher: Any) -> tuple[tuple[str, str, str], ...] | None:
    """Where ``matcher`` stands inside the free string it has a memo of (mid-escape,
    say), the key of its mask there: its parser points as printed; None within an
    element (a character's bytes), where the points do not say all."""
    found = tuple(_STATE.findall(_state(matcher)))
    if not found or any(sub != "0" for _, _, sub in found):
        return None
    return found


def memo_hit(matcher: Any, key: tuple) -> np.ndarray | None:
    """The mask ``matcher`` remembers in its string for the points ``key``: the one
    filled there, or where those points were found before (in any string of the
    grammar) to be starts of the rules this string started in, the string's start mask:
    the same rules waiting for the same end."""
    memo = matcher.memo
    hit = memo.get(key)
    if hit is None:
        rules = matcher._kept.starts_of.get(key)
        if rules is not None:
            hit = memo.get(("start", rules))
        else:
            hit = _mid_escape(matcher, key)
            if hit is not None:
                memo[key] = hit
    return hit


def _mid_escape(matcher: Any, key: tuple) -> np.ndarray | None:
    """``matcher``'s mask mid-escape in its string, derived from the string's start mask
    (`escape_masks`); None where it does not stand in JSON's escape rule, or its memo
    holds no start of one set of rules."""
    kept = matcher._kept
    at = matcher.memo.get("start") if kept.escapes else None
    if at is None:
        return None
    found = kept.escape_kind(matcher, key, at[1])
    if found is None:
        return None
    kind, tables = found
    return tables.mask(kind, matcher.memo[at], matcher.stops, matcher)


def known_source(matcher: Any) -> tuple[np.ndarray | None, Any]:
    """Before a fill: the mask ``matcher`` keeps, or remembers in its string's memo, for
    its state (None: it must be filled), and the memo key to give `use_known` or
    `after_fill` (None: nothing to remember)."""
    if getattr(matcher, "keep", 0):
        return matcher.kept, None
    if getattr(matcher, "memo", None) is None:
        return None, None
    key = memo_key(matcher)
    if key is None:
        return None, None
    return memo_hit(matcher, key), key


def use_known(matcher: Any, view: np.ndarray, row: int, source: np.ndarray, key: Any) -> None:
    """Copy ``source`` (from `known_source`) into ``view[row]``."""
    view[row] = source
    if key is not None and matcher.probe:  # back at the string's text: kept again
        keep_if_free(matcher, view, row, key)


def known_mask(matcher: Any, view: np.ndarray, row: int) -> tuple[bool, Any]:
    """`known_source` and `use_known` at once: whether the row was copied, and the key."""
    source, key = known_source(matcher)
    if source is None:
        return False, key
    use_known(matcher, view, row, source, key)
    return True, key


def after_fill(matcher: Any, view: np.ndarray, row: int, key: Any) -> None:
    """After ``matcher``'s fill into ``view[row]``: the check it asked for, and the mask
    remembered under ``key`` (from `known_mask`)."""
    if getattr(matcher, "probe", 0):
        keep_if_free(matcher, view, row, key)
    if key is not None and key not in matcher.memo:  # (a string's start: kept already)
        matcher.memo[key] = view[row].copy()


def kept_for(grammar: Any, plain: PlainTables) -> KeptStrings:
    """The grammar's `KeptStrings` for a vocabulary's tables, built once."""
    kept = getattr(grammar, "_kept_strings", None)
    if kept is None or kept.plain is not plain:
        kept = KeptStrings(str(grammar.grammar), plain)
        try:
            grammar._kept_strings = kept
        except AttributeError:  # a grammar object that takes no attributes: not kept
            pass
    return kept
