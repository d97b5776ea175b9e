"""Masks mid-escape in a free JSON string, derived instead of filled.

A fill mid-escape (right after a backslash, or in a ``\\u`` escape's digits) is the
costliest in a JSON string: any token that begins with a letter or a digit might
finish the escape and go on with the string, so xgrammar walks thousands of them
through the grammar past the escape's end (0.7 to 0.9 ms with a 200k vocabulary, where
a fill elsewhere in a string takes 10 to 60 µs). The answer needs little of the
grammar. JSON's escape rule is fixed (one of ``"\\/bfnrt``, or ``u`` and four hex
digits), and once an escape is complete the string's rules stand at their starts
again, where the string's memo (`string_masks`) holds the mask filled when the string
began. So from a point mid-escape a token is

- refused where its first bytes do not go on with the escape;
- allowed where it ends within the escape, or completes it and goes on with characters
  plain in the string's rules (whole characters of their class that begin no other
  alternative): whatever follows the string;
- else allowed where the string's start allows the rest of its bytes, ``q`` (the
  escape completed, it ends the string, or begins another escape, with what follows):
  the start mask's bit of a *witness*, an ordinary token whose bytes are ``q``, or are
  ``q`` from its first character that is not plain; where the vocabulary has none,
  the answer of a fork of the matcher, token by token (tens of tokens in a 150k or
  200k vocabulary, after a backslash only).

`EscapeTables` sorts a vocabulary's tokens so, once per set of string classes (each
kind of point mid-escape: a refusal, a sure token, or a token to ask about and its
witness); `EscapeTables.mask` applies them to one string's start mask in a few array
operations. The points mid-escape are told apart by stepping forks of the matcher
(`escape_kind`), once per grammar and point.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .vocab import pack_ids

#: JSON's escape rule, as xgrammar prints it (a lookahead after it changes nothing)
_ESCAPE_RULE = re.compile(
    r'^\S+ ::= \(\(\[\\"\\\\/bfnrt\]\) \| \("u"(?: \[A-Fa-f0-9\]){4}\)\)(?: \(=.*\))?$'
)
#: the same escape spelled as a chain of rules, as in a string that must not contain
#: some text (a structural tag's end tag): after the backslash, a letter and back to
#: the string's rule, or ``u`` and four rules of one hex digit each
_AFTER_BACKSLASH_RULE = re.compile(
    r'^(?P<name>\S+) ::= \(\((?P<cls>\[(?:\\.|[^\]\\])*\]) (?P<back>\S+)\) \| \("u" (?P<u>\S+)\)\)$'
)
_DIGIT_RULE = re.compile(r"^(?P<name>\S+) ::= \(\((?P<cls>\[(?:\\.|[^\]\\])*\]) (?P<next>\S+)\)\)$")
_NAME = re.compile(r"^(\S+) ::= ")
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_HEX = np.zeros(256, bool)
_HEX[list(_HEX_DIGITS)] = True
_LETTERS = np.zeros(256, bool)
_LETTERS[list(b'"\\/bfnrt')] = True
#: the kinds of point mid-escape: right after the backslash, or 1 to 4 hex digits due
AFTER_BACKSLASH = 0
KINDS = (AFTER_BACKSLASH, 1, 2, 3, 4)

#: one rule's class: (ranges, negated, first characters of its other alternatives)
RuleClass = tuple[tuple[tuple[int, int], ...], bool, frozenset[int]]


def escape_rules(grammar_text: str, char_class: Any) -> frozenset[int]:
    """The ids of the rules of a grammar's text that read a JSON escape past its
    backslash: JSON's escape rule, or each rule of a chain that spells it.
    ``char_class``: ``"[...]"`` -> (ranges, negated), as the grammar's text writes it."""
    lines = grammar_text.split("\n")
    ids = {m[1]: i for i, line in enumerate(lines) if (m := _NAME.match(line))}
    found = {i for i, line in enumerate(lines) if _ESCAPE_RULE.match(line)}
    for line in lines:
        head = _AFTER_BACKSLASH_RULE.match(line)
        if head is None or _codes(head["cls"], char_class) != set(b'"\\/bfnrt'):
            continue
        chain, name = [ids[head["name"]]], head["u"]
        for _ in range(4):  # four rules of one hex digit, the last back to the string
            at = ids.get(name)
            digit = _DIGIT_RULE.match(lines[at]) if at is not None else None
            if digit is None or _codes(digit["cls"], char_class) != set(_HEX_DIGITS):
                break
            chain.append(at)
            name = digit["next"]
        else:
            if name == head["back"]:
                found.update(chain)
    return frozenset(found)


def _codes(cls: str, char_class: Any) -> set[int] | None:
    """The code points of a small class that is not negated (None where it is negated
    or holds more than 64: no escape's)."""
    ranges, negated = char_class(cls)
    if negated or sum(hi - lo + 1 for lo, hi in ranges) > 64:
        return None
    return {c for lo, hi in ranges for c in range(lo, hi + 1)}


def escape_kind(fork: Any) -> int | None:
    """The kind of point mid-escape where ``fork()`` (a new xgrammar matcher each call)
    stands: `AFTER_BACKSLASH`, or the hex digits due (1 to 4); None where it is
    neither (stepping over ``n`` and ``0`` tells them apart: ``n`` is an escape letter
    and no hex digit, and plain in the string once the escape is complete)."""
    if fork().accept_string("n"):
        return AFTER_BACKSLASH
    m = fork()
    for due in range(1, 5):
        if not m.accept_string("0"):
            return None
        if m.fork().accept_string("n"):
            return due
    return None


def in_class(points: np.ndarray, rule: RuleClass) -> tuple[np.ndarray, np.ndarray]:
    """Per code point: in the rule's class and no first character (plain), and in
    neither the class nor the first characters (refused by the rule)."""
    ranges, negated, firsts = rule
    inside = np.zeros(len(points), dtype=bool)
    for lo, hi in ranges:
        inside |= (points >= lo) & (points <= hi)
    if negated:
        inside = ~inside
    first = np.isin(points, np.fromiter(firsts, dtype=np.int64)) if firsts else inside & False
    return inside & ~first, ~inside & ~first


class EscapeTables:
    """For one vocabulary and the classes of a string's rules (side by side: a token is
    plain where it is plain in all), per kind of point mid-escape: ``sure`` (uint32
    words: the tokens allowed whatever follows the string), and the tokens to ask
    about, those with a witness (``asked``, ``witness``) and those without
    (``forked``)."""

    def __init__(
        self,
        token_bytes: Sequence[bytes],
        vocab_rows: int,
        code_points: tuple[np.ndarray, np.ndarray, np.ndarray],
        rules: Sequence[RuleClass],
    ) -> None:
        tb = list(token_bytes[:vocab_rows])
        n = len(tb)
        lengths = np.fromiter(map(len, tb), np.int64, n)
        flat = np.frombuffer(b"".join(tb) + bytes(6), np.uint8)  # padded past the end
        starts_b = np.cumsum(lengths) - lengths
        # each token's first bytes (zeros past its end, masked below)
        head = flat[starts_b[:, None] + np.arange(6)[None, :]]
        hexes = _HEX[head] & (np.arange(6)[None, :] < lengths[:, None])
        run = np.cumprod(hexes, axis=1).sum(axis=1)  # leading hex digits (at most 6)
        run_after_u = np.cumprod(hexes[:, 1:], axis=1).sum(axis=1)
        # per token: from which byte its text is plain to the end (whole characters
        # plain in every rule): tokens that are not whole characters never are
        points, starts, ids = code_points
        plain = np.ones(len(points), dtype=bool)
        for rule in rules:
            ok, _ = in_class(points, rule)
            plain &= ok
        last_bad = np.full(n, 1 << 30, dtype=np.int64)  # past every escape: never plain
        last_bad[ids] = -1
        bad = np.flatnonzero(~plain)  # few: quotes, backslashes, control characters
        owner = np.searchsorted(starts, bad, side="right") - 1
        np.maximum.at(last_bad, ids[owner], bad - starts[owner])
        self._rules = tuple(rules)
        self.vocab_rows = vocab_rows
        self._chars: dict[int, tuple[bool, bool]] = {}
        words = -(-vocab_rows // 32)
        self.kinds: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for kind in KINDS:
            if kind == AFTER_BACKSLASH:
                letter = _LETTERS[head[:, 0]] & (lengths > 0)
                u = (head[:, 0] == ord("u")) & (lengths > 0)
                within = u & (run_after_u >= lengths - 1) & (lengths <= 5)
                through = np.where(letter, 1, np.where(u & ~within & (run_after_u >= 4), 5, 0))
            else:
                within = (lengths > 0) & (run >= lengths) & (lengths <= kind)
                through = np.where(~within & (run >= kind), kind, 0)
            # ``through``: the bytes of a token that complete the escape (0: it does not)
            goes_on = through > 0
            rest_plain = goes_on & ((lengths == through) | (last_bad < through))
            sure = within | rest_plain
            ask = np.flatnonzero(goes_on & ~rest_plain)
            asked, witness, forked = self._witnesses(ask, through[ask], tb)
            packed = pack_ids(sure, words)
            packed.setflags(write=False)  # returned as it is where nothing is asked
            self.kinds[kind] = (packed, asked, witness, forked)
        #: every witness, to tell one that a matcher's stop tokens take (asked then)
        self.witnesses = frozenset(
            int(w) for _, _, ws, _ in self.kinds.values() for w in ws.tolist()
        )

    def _witnesses(
        self, ask: np.ndarray, through: np.ndarray, tb: list[bytes]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The tokens ``ask`` whose rest (past their first ``through`` bytes) may be
        allowed, with a witness or without: none whose first character past the plain
        ones is refused by every rule."""
        rests: list[tuple[int, bytes]] = []
        for t, j in zip(ask.tolist(), through.tolist(), strict=True):
            q = tb[t][j:]
            try:  # its whole characters, then what is not one (bytes of a cut one)
                text, tail = q.decode("utf-8"), b""
            except UnicodeDecodeError as e:
                text, tail = q[: e.start].decode("utf-8"), q[e.start :]
            for f, c in enumerate(text):  # from its first character that is not plain
                plain, refused = self._char(ord(c))
                if not plain:
                    if not refused:
                        rests.append((t, text[f:].encode("utf-8") + tail))
                    break
            else:
                rests.append((t, tail))
        need = {q for _, q in rests}
        by_bytes = {b: i for i, b in enumerate(tb) if b in need} if need else {}
        asked = [(t, by_bytes[q]) for t, q in rests if q in by_bytes]
        forked = [t for t, q in rests if q not in by_bytes]
        return (
            np.asarray([t for t, _ in asked], dtype=np.int64),
            np.asarray([w for _, w in asked], dtype=np.int64),
            np.asarray(forked, dtype=np.int64),
        )

    def _char(self, c: int) -> tuple[bool, bool]:
        """Whether code point ``c`` is plain in every rule, and refused by every rule."""
        found = self._chars.get(c)
        if found is None:
            point = np.asarray([c], dtype=np.int64)
            kinds = [in_class(point, rule) for rule in self._rules]
            found = self._chars[c] = (
                all(bool(ok[0]) for ok, _ in kinds),
                all(bool(no[0]) for _, no in kinds),
            )
        return found

    def mask(self, kind: int, start: np.ndarray, stops: Sequence[int], matcher: Any) -> np.ndarray:
        """The mask (uint32 words; read-only, maybe shared) at a point of ``kind`` in a
        string whose rules' start mask is ``start`` (as xgrammar filled it, before any
        guard), for a matcher standing there (forked for the tokens without a witness)
        that ends on ``stops``."""
        sure, asked, witness, forked = self.kinds[kind]
        stopped = [s for s in stops if 0 <= s < self.vocab_rows and sure[s >> 5] >> (s & 31) & 1]
        if not len(asked) and not len(forked) and not stopped:
            return sure  # whatever follows the string
        out = sure.copy()
        if len(asked):
            taken = [s for s in stops if s in self.witnesses]
            if taken:  # a stop token's bit says nothing of its bytes: ask the fork
                by_stop = np.isin(witness, taken)
                forked = np.concatenate((forked, asked[by_stop]))
                asked, witness = asked[~by_stop], witness[~by_stop]
            yes = asked[(start[witness >> 5] >> (witness & 31).astype(np.uint32)) & 1 != 0]
            np.bitwise_or.at(out, yes >> 5, np.left_shift(1, yes & 31).astype(np.uint32))
        if len(forked):
            fork = matcher.fork()
            for t in forked.tolist():
                if fork.accept_token(t):
                    out[t >> 5] |= np.uint32(1 << (t & 31))
                    fork.rollback(1)
        for s in stops:  # never text: a stop token ends the grammar, not mid-escape
            if 0 <= s < self.vocab_rows:
                out[s >> 5] &= ~np.uint32(1 << (s & 31))
        out.setflags(write=False)
        return out


def _normal(rule: RuleClass) -> RuleClass:
    """The same class with its ranges sorted and merged: xgrammar writes JSON's string
    class in more than one way (its builtin grammar's, a schema's)."""
    ranges, negated, firsts = rule
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged), negated, firsts


class EscapeCache:
    """A vocabulary's `EscapeTables`, one per set of string classes, built once."""

    def __init__(self) -> None:
        self._tables: dict[Any, EscapeTables] = {}
        self._lock = threading.Lock()

    def get(
        self,
        token_bytes: Sequence[bytes],
        vocab_rows: int,
        code_points: Any,
        rules: Sequence[RuleClass],
    ) -> EscapeTables:
        key = frozenset(map(_normal, rules))
        with self._lock:
            found = self._tables.get(key)
            if found is None:
                found = self._tables[key] = EscapeTables(
                    token_bytes, vocab_rows, code_points(), list(key)
                )
            return found
