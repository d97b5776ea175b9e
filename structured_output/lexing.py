"""The guard's lexer (`guard.py`): where accepted text stands lexically, byte by byte,
and what each token of a vocabulary does from each lexical state.

States: outside a JSON string (``OUT``, where whitespace runs are counted), inside one
(``STR``), after a backslash (``ESC``), in a ``\\u`` escape (``U0``: no digit yet;
``UD1``: first digit ``d``; ``UH2``/``UH3``: two or three digits of a high surrogate),
after a complete high surrogate escape, which only its low half may follow (``PH``,
then ``PH1`` after its backslash, ``PH2`` after ``u``, ``PH3`` after ``d``), and raw
text that is not lexed (``RAW``). A byte that would write an escape of a lone
surrogate (``\\udc00`` alone, ``\\ud83d`` followed by anything but ``\\udc00``-
``\\udfff``) leads to ``INVALID``: strict JSON parsers refuse those strings, and no
UTF-8 encoder can write them out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .utf8 import token_states

OUT, STR, ESC, RAW, U0, UD1, UH2, UH3, PH, PH1, PH2, PH3 = range(12)
NUM_STATES = 12
#: the sink of bytes that would write a lone surrogate escape (not a state of the text)
INVALID = NUM_STATES
#: the states inside a string where the text is mid-escape
ESCAPING = (ESC, U0, UD1, UH2, UH3, PH, PH1, PH2, PH3)
#: the escape states where some single byte is refused (a ``c`` after ``\\ud``)
NARROW = (UD1, PH, PH1, PH2, PH3)
WS = frozenset(b" \t\n\r")
LEAD_ED = 0xED


def _table() -> np.ndarray:
    """``T[state, byte]``: the next state (``INVALID`` a sink)."""
    t = np.full((NUM_STATES + 1, 256), INVALID, dtype=np.int64)
    hexes = b"0123456789abcdefABCDEF"
    t[OUT, :] = OUT
    t[OUT, ord('"')] = STR
    t[STR, :] = STR
    t[STR, ord('"')] = OUT
    t[STR, ord("\\")] = ESC
    t[ESC, :] = STR
    t[ESC, ord("u")] = U0
    t[RAW, :] = RAW
    t[U0, :] = t[STR, :]  # not a digit: the escape is malformed (the grammar refuses it)
    t[U0, list(hexes)] = STR  # a digit but d: no surrogate, the rest are plain digits
    t[U0, list(b"dD")] = UD1
    t[UD1, list(b"01234567")] = STR
    t[UD1, list(b"89abAB")] = UH2
    t[UH2, list(hexes)] = UH3
    t[UH3, list(hexes)] = PH
    t[PH, ord("\\")] = PH1
    t[PH1, ord("u")] = PH2
    t[PH2, list(b"dD")] = PH3
    t[PH3, list(b"cdefCDEF")] = STR
    return t


TABLE = _table()
_TABLE_ROWS = TABLE.tolist()


def step(state: int, byte: int) -> int:
    return _TABLE_ROWS[state][byte]


def lex_one(b: bytes, s: int) -> tuple[int, int, int, int, bool, bool]:
    """``(next, lead, inner, trail, pure, invalid)`` of token ``b`` from state ``s``:
    see `lex_tokens`."""
    run = 0
    first = s == OUT
    lead = inner = 0
    for byte in b:
        if s == OUT and byte in WS:
            run += 1
            continue
        if s == OUT:
            if first:
                lead = run
            else:
                inner = max(inner, run)
            run = 0
        first = False
        s = _TABLE_ROWS[s][byte]
        if s == INVALID:
            return STR, 0, 0, 0, False, True
    if first:  # whitespace only, from OUT
        return s, run, 0, run, run > 0, False
    return s, lead, max(inner, run), run if s == OUT else 0, False, False


def lex_tokens(tb: list[bytes]) -> dict[str, Any]:
    """Per start state and token: the end state (``next``), the whitespace run outside
    strings at the token's start (``lead``; the whole length for ``pure`` tokens,
    which are such whitespace only), the longest other such run (``inner``, the
    trailing one included), the run it ends with (``trail``), whether it writes a lone
    surrogate escape (``invalid``); per UTF-8 pending state and token, the pending
    state it ends in (``pending``: `utf8.token_states`); and per token ``len``,
    ``first`` (its first byte), ``surrogate`` (it holds an encoded surrogate,
    ``ED A0..BF``) and the number of distinct ``single_bytes`` tokens.

    Tokens without a quote or a backslash (all but about 1%) never leave ``OUT`` or
    ``STR``, so their runs are found with array operations over all their bytes at
    once, and from the escape states they are walked a few bytes at a time through
    `TABLE`, all of them together; the others are lexed one by one."""
    n = len(tb)
    lengths = np.fromiter((len(b) for b in tb), np.int64, n)
    flat = np.frombuffer(b"".join(tb), dtype=np.uint8)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    owner = np.repeat(np.arange(n), lengths)
    lead, inner, trail, pure = _runs(flat, owner, starts, ends, lengths)
    nonempty = lengths > 0
    first = np.zeros(n, np.int64)
    first[nonempty] = flat[starts[nonempty]]
    pair = (flat[:-1] == LEAD_ED) & (flat[1:] >= 0xA0) & (flat[1:] <= 0xBF)
    pair &= owner[:-1] == owner[1:]
    surrogate = np.zeros(n, bool)
    surrogate[owner[:-1][pair]] = True
    quoting = np.zeros(n, bool)
    quoting[owner[(flat == 0x22) | (flat == 0x5C)]] = True

    def zeros() -> np.ndarray:
        return np.zeros(n, np.int64)

    out: dict[str, Any] = {
        "len": lengths,
        "first": first,
        "pending": token_states(flat, starts, lengths),
        "surrogate": surrogate,
        "single_bytes": len(np.unique(first[lengths == 1])),
        "next": [np.full(n, s, np.int64) for s in range(NUM_STATES)],
        "lead": [lead] + [zeros() for _ in range(NUM_STATES - 1)],
        "inner": [inner] + [zeros() for _ in range(NUM_STATES - 1)],
        "trail": [trail] + [zeros() for _ in range(NUM_STATES - 1)],
        "pure": [pure] + [np.zeros(n, bool) for _ in range(NUM_STATES - 1)],
        "invalid": [np.zeros(n, bool) for _ in range(NUM_STATES)],
    }
    plain = np.flatnonzero(nonempty & ~quoting)
    for s in ESCAPING:
        _walk(out, s, plain, flat, starts, lengths)
    for t in np.flatnonzero(quoting).tolist():
        for s in range(NUM_STATES):
            if s == RAW:
                continue
            nxt, ld, inn, tr, pu, bad = lex_one(tb[t], s)
            out["next"][s][t] = nxt
            out["lead"][s][t] = ld
            out["inner"][s][t] = inn
            out["trail"][s][t] = tr
            out["pure"][s][t] = pu
            out["invalid"][s][t] = bad
    return out


def _runs(
    flat: np.ndarray, owner: np.ndarray, starts: np.ndarray, ends: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``lead, inner, trail, pure`` from ``OUT`` of tokens without quotes, for all."""
    n = len(lengths)
    is_ws = np.isin(flat, np.frombuffer(bytes(sorted(WS)), dtype=np.uint8))
    pos = np.arange(len(flat))
    run_start = is_ws & ((pos == starts[owner]) | ~np.concatenate(([False], is_ws[:-1])))
    run_end = is_ws & ((pos == ends[owner] - 1) | ~np.concatenate((is_ws[1:], [False])))
    rs, re_ = np.flatnonzero(run_start), np.flatnonzero(run_end)
    run_len = re_ - rs + 1
    run_tok = owner[rs]
    at_start = rs == starts[run_tok]
    at_end = re_ == ends[run_tok] - 1
    lead = np.zeros(n, np.int64)
    lead[run_tok[at_start]] = run_len[at_start]
    trail = np.zeros(n, np.int64)
    trail[run_tok[at_end]] = run_len[at_end]
    inner = np.zeros(n, np.int64)
    np.maximum.at(inner, run_tok[~at_start], run_len[~at_start])
    pure = (lead == lengths) & (lengths > 0)
    inner[pure] = 0
    trail[pure] = lengths[pure]
    return lead, inner, trail, pure


def _walk(
    out: dict[str, Any],
    s: int,
    tokens: np.ndarray,
    flat: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """From escape state ``s``, ``tokens`` (no quote, no backslash) through `TABLE`
    byte by byte, all at once, until each is back in ``STR``, ``INVALID`` or ends."""
    idx = tokens
    state = np.full(len(idx), s, np.int64)
    pos = 0
    while len(idx):
        state = TABLE[state, flat[starts[idx] + pos]]
        pos += 1
        done = (state == STR) | (state == INVALID) | (lengths[idx] <= pos)
        if done.any():
            d, st = idx[done], state[done]
            out["invalid"][s][d] = st == INVALID
            out["next"][s][d] = np.where(st == INVALID, STR, st)
            idx, state = idx[~done], state[~done]
