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
UTF-8 encoder can write them out. A raw control character (U+0000 to U+001F) inside a
string, which xgrammar's length-bounded strings let through, leads to ``CTRL``: refused
as well, but a grammar whose strings refuse it by themselves needs no mask for it
(`guard.refuses_control`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .utf8 import token_states

OUT, STR, ESC, RAW, U0, UD1, UH2, UH3, PH, PH1, PH2, PH3 = range(12)
NUM_STATES = 12
#: the sink of bytes that would write a lone surrogate escape (not a state of the text)
INVALID = NUM_STATES
#: the sink of a raw control character inside a string (``>= INVALID``: refused too)
CTRL = NUM_STATES + 1
#: the states inside a string where the text is mid-escape
ESCAPING = (ESC, U0, UD1, UH2, UH3, PH, PH1, PH2, PH3)
#: the escape states where some single byte is refused (a ``c`` after ``\\ud``)
NARROW = (UD1, PH, PH1, PH2, PH3)
WS = frozenset(b" \t\n\r")
LEAD_ED = 0xED


def _table() -> np.ndarray:
    """``T[state, byte]``: the next state (``INVALID`` a sink)."""
    t = np.full((CTRL + 1, 256), INVALID, dtype=np.int8)
    hexes = b"0123456789abcdefABCDEF"
    t[OUT, :] = OUT
    t[OUT, ord('"')] = STR
    t[STR, :] = STR
    t[STR, :0x20] = CTRL  # a raw control character: strict JSON parsers refuse it
    t[STR, ord('"')] = OUT
    t[STR, ord("\\")] = ESC
    t[ESC, :] = STR
    t[ESC, :0x20] = CTRL
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
_IS_WS = np.isin(np.arange(256), sorted(WS))


def step(state: int, byte: int) -> int:
    return _TABLE_ROWS[state][byte]


def lex_tokens(tb: list[bytes]) -> dict[str, Any]:
    """Per start state and token (arrays ``[NUM_STATES, len(tb)]``): the end state
    (``next``, int8), the whitespace run outside strings at the token's start
    (``lead``; the whole length for ``pure`` tokens, which are such whitespace only),
    the longest other such run (``inner``, the trailing one included), the run it ends
    with (``trail``), whether it is refused (``invalid``: it writes a lone surrogate
    escape or a raw control character in a string), whether for the latter alone
    (``ctrl``) and whether the text is outside any string at one of its byte
    boundaries, its start and end included, or refused (``left``: from inside a
    string, a token that may end it and begin the next, ``":"``, while ``\\"`` does
    not); per
    UTF-8 pending state and token, the pending state it ends in (``pending``:
    `utf8.token_states`); and per token ``len``, ``first`` (its first byte),
    ``surrogate`` (it holds an encoded surrogate, ``ED A0..BF``) and the number of
    distinct ``single_bytes`` tokens. ``RAW`` is not lexed: its row says nothing.

    Tokens without a quote or a backslash (all but about 1%) never leave ``OUT`` or
    ``STR``, so their runs are found with array operations over all their bytes at
    once; from an escape state, all of them take their first byte at once, and the
    few that go on, and the rest from every state, are walked through `TABLE` a byte
    position at a time, all together (`_walk`). Small integer types throughout: a
    build touches little fresh memory."""
    n = len(tb)
    lengths = np.fromiter(map(len, tb), np.int64, n)
    flat = np.frombuffer(b"".join(tb), dtype=np.uint8)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    owner = np.repeat(np.arange(n, dtype=np.int32), lengths)
    nonempty = lengths > 0
    first = np.zeros(n, np.int64)
    first[nonempty] = flat[starts[nonempty]]
    pair = (flat[:-1] == LEAD_ED) & (flat[1:] >= 0xA0) & (flat[1:] <= 0xBF)
    pair &= owner[:-1] == owner[1:]
    surrogate = np.zeros(n, bool)
    surrogate[owner[:-1][pair]] = True
    # tokens whose walk through a string is not plain: a quote, a backslash, or a raw
    # control character (refused inside strings) in them
    quoting = np.zeros(n, bool)
    quoting[owner[(flat == 0x22) | (flat == 0x5C) | (flat < 0x20)]] = True

    shape = (NUM_STATES, n)
    out: dict[str, Any] = {
        "len": lengths,
        "first": first,
        "pending": token_states(flat, starts, lengths),
        "surrogate": surrogate,
        "single_bytes": int(np.count_nonzero(np.bincount(first[lengths == 1], minlength=256))),
        "next": np.repeat(np.arange(NUM_STATES, dtype=np.int8)[:, None], n, axis=1),
        "lead": np.zeros(shape, np.int32),
        "inner": np.zeros(shape, np.int32),
        "trail": np.zeros(shape, np.int32),
        "pure": np.zeros(shape, bool),
        "invalid": np.zeros(shape, bool),
        "ctrl": np.zeros(shape, bool),
        "left": np.zeros(shape, bool),
    }
    out["left"][OUT] = True
    runs = _runs(flat, owner, starts[nonempty], ends[nonempty], lengths)
    for key, value in zip(("lead", "inner", "trail", "pure"), runs, strict=True):
        out[key][OUT] = value  # quoting tokens: overwritten by their walk below
    # From an escape state, a token without quotes and backslashes is back in ``STR``
    # (where it stays), or refused, after a byte or a few: its first byte, for all at
    # once, then the few that go on, byte by byte
    plain = np.flatnonzero(nonempty & ~quoting)
    escaping = np.array(ESCAPING)
    after = TABLE[escaping[:, None], first[plain][None, :]]
    bad = after >= INVALID  # plain tokens hold no control byte: never CTRL
    block = np.ix_(escaping, plain)
    out["next"][block] = np.where(bad, STR, after)
    out["invalid"][block] = bad
    out["left"][block] = bad
    go_on = np.nonzero(~bad & (after != STR) & (lengths[plain] > 1)[None, :])
    _walk(out, escaping[go_on[0]], after[go_on], plain[go_on[1]], 1, flat, starts, lengths, quoting)
    # tokens with quotes or backslashes, from every state but RAW, byte by byte
    quoted = np.flatnonzero(quoting)
    lexed = np.array([s for s in range(NUM_STATES) if s != RAW], dtype=np.int8)
    begin = np.repeat(lexed, len(quoted))
    _walk(out, begin, begin, np.tile(quoted, len(lexed)), 0, flat, starts, lengths, quoting)
    return out


def _runs(
    flat: np.ndarray, owner: np.ndarray, starts: np.ndarray, ends: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``lead, inner, trail, pure`` from ``OUT`` of tokens without quotes, for all
    (``starts``, ``ends``: of the tokens that are not empty)."""
    n = len(lengths)
    is_ws = _IS_WS[flat]
    at_first = np.zeros(len(flat), bool)  # a token's first byte
    at_first[starts] = True
    at_last = np.zeros(len(flat), bool)
    at_last[ends - 1] = True
    rs = np.flatnonzero(is_ws & (at_first | ~np.concatenate(([False], is_ws[:-1]))))
    re_ = np.flatnonzero(is_ws & (at_last | ~np.concatenate((is_ws[1:], [False]))))
    run_len = (re_ - rs + 1).astype(np.int32)
    run_tok = owner[rs]
    at_start, at_end = at_first[rs], at_last[re_]
    lead = np.zeros(n, np.int32)
    lead[run_tok[at_start]] = run_len[at_start]
    trail = np.zeros(n, np.int32)
    trail[run_tok[at_end]] = run_len[at_end]
    inner = np.zeros(n, np.int32)
    np.maximum.at(inner, run_tok[~at_start], run_len[~at_start])
    pure = (lead == lengths) & (lengths > 0)
    inner[pure] = 0
    trail[pure] = lengths[pure]
    return lead, inner, trail, pure


def _walk(
    out: dict[str, Any],
    start: np.ndarray,
    state: np.ndarray,
    tokens: np.ndarray,
    pos: int,
    flat: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    quoting: np.ndarray,
) -> None:
    """Token ``tokens[i]``, lexed from state ``start[i]`` and now in ``state[i]``
    after its first ``pos`` bytes (outside strings at most at its start: ``pos`` 0),
    through `TABLE`, a byte position at a time, all together: whitespace outside
    strings counted in runs, until the token ends, writes a lone surrogate escape
    (``INVALID``), or is back in ``STR`` with no quote or backslash in it (where it
    stays). Writes each one's column of ``out``'s ``start`` rows."""
    idx = np.arange(len(tokens))  # the walks still going
    st = state.copy()
    run = np.zeros(len(idx), np.int32)
    lead = np.zeros(len(idx), np.int32)
    inner = np.zeros(len(idx), np.int32)
    only_ws = (st == OUT) & (pos == 0)  # from OUT, nothing but whitespace so far
    seen = st == OUT  # outside strings at a byte boundary so far
    while len(idx):
        tok = tokens[idx]
        byte = flat[starts[tok] + pos]
        pos += 1
        at = np.flatnonzero(st == OUT)  # runs are counted here
        if len(at):
            ws = _IS_WS[byte[at]]
            run[at[ws]] += 1
            leave = at[~ws]  # a run outside strings ends here
            first = only_ws[leave]
            lead[leave[first]] = run[leave[first]]
            later = leave[~first]
            inner[later] = np.maximum(inner[later], run[later])
            run[leave] = 0
            only_ws[leave] = False
        st = TABLE[st, byte]  # whitespace leaves OUT as it is
        seen |= st == OUT
        bad = st >= INVALID
        done = bad | (lengths[tok] <= pos) | ((st == STR) & ~quoting[tok])
        if not done.any():
            continue
        s, t, ended, b = start[idx[done]], tok[done], st[done], bad[done]
        out["next"][s, t] = np.where(b, STR, ended)
        out["invalid"][s, t] = b
        out["ctrl"][s, t] = ended == CTRL
        out["left"][s, t] = seen[done] | b
        o, r = only_ws[done] & ~b, np.where(b, 0, run[done])
        out["lead"][s, t] = np.where(o, r, np.where(b, 0, lead[done]))
        out["inner"][s, t] = np.where(o | b, 0, np.maximum(inner[done], r))
        out["trail"][s, t] = np.where(o | (ended == OUT), r, 0)
        out["pure"][s, t] = o & (r > 0)
        keep = ~done
        idx, st, run, lead, inner, only_ws, seen = (
            idx[keep],
            st[keep],
            run[keep],
            lead[keep],
            inner[keep],
            only_ws[keep],
            seen[keep],
        )
