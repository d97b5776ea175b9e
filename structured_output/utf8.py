"""UTF-8 across token boundaries, for the guard (`guard.py`): where accepted bytes
stand in a UTF-8 sequence, and what each token of a vocabulary does from there.

A byte-level vocabulary splits characters between tokens (``E9 A2`` and then ``80``),
so a text can be left mid-character after any token. The pending states say what the
next byte must be:

- ``DONE``: the text ends with a whole character (or is empty);
- ``NEED1``/``NEED2``/``NEED3``: one, two or three continuation bytes (``80..BF``);
- ``AFTER_E0``, ``AFTER_ED``, ``AFTER_F0``, ``AFTER_F4``: after a lead byte whose
  second byte is narrower: ``A0..BF`` (no overlong form), ``80..9F`` (no surrogate),
  ``90..BF`` (no overlong form), ``80..8F`` (nothing past U+10FFFF); then one or two
  more continuation bytes.

`TABLE` is the automaton over single bytes; ``ERROR`` is its sink: a stray
continuation byte, a lead byte that can never start a character (``C0``, ``C1``,
``F5..FF``), a character cut short by another one, or a narrower second byte out of
its range. `token_states` runs it over every token of a vocabulary from every
pending state at once. An empty token (a special token: one marker, no bytes) is
refused while a character is pending: its text would follow the incomplete bytes.
"""

from __future__ import annotations

import numpy as np

DONE, NEED1, NEED2, NEED3, AFTER_E0, AFTER_ED, AFTER_F0, AFTER_F4 = range(8)
NUM_PENDING = 8
#: the sink of ill-formed sequences (not a state of the text)
ERROR = NUM_PENDING


def _table() -> np.ndarray:
    """``T[pending, byte]``: the next pending state (``ERROR`` a sink)."""
    t = np.full((NUM_PENDING + 1, 256), ERROR, dtype=np.int8)
    t[DONE, 0x00:0x80] = DONE
    t[DONE, 0xC2:0xE0] = NEED1
    t[DONE, 0xE0] = AFTER_E0
    t[DONE, 0xE1:0xF0] = NEED2
    t[DONE, 0xED] = AFTER_ED
    t[DONE, 0xF0] = AFTER_F0
    t[DONE, 0xF1:0xF4] = NEED3
    t[DONE, 0xF4] = AFTER_F4
    t[NEED1, 0x80:0xC0] = DONE
    t[NEED2, 0x80:0xC0] = NEED1
    t[NEED3, 0x80:0xC0] = NEED2
    t[AFTER_E0, 0xA0:0xC0] = NEED1
    t[AFTER_ED, 0x80:0xA0] = NEED1
    t[AFTER_F0, 0x90:0xC0] = NEED2
    t[AFTER_F4, 0x80:0x90] = NEED2
    return t


TABLE = _table()
_TABLE_ROWS = TABLE.tolist()


def step(pending: int, byte: int) -> int:
    return _TABLE_ROWS[pending][byte]


def run_bytes(pending: int, data: bytes) -> int:
    """The pending state after ``data`` (``ERROR`` if it is ill-formed from there)."""
    if not data and pending != DONE:
        return ERROR
    for byte in data:
        pending = _TABLE_ROWS[pending][byte]
    return pending


def token_states(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``E[pending, token]``: the pending state each token ends in from each pending
    state, ``ERROR`` where its bytes are ill-formed there (int8). ``flat`` holds every
    token's bytes end to end, token ``i`` at ``starts[i]`` for ``lengths[i]`` bytes.

    Tokens of ASCII bytes only (most of any vocabulary) leave ``DONE`` as it is and
    are refused from every other state; the others are walked through `TABLE` a byte
    position at a time, all of them and every start state together."""
    n = len(lengths)
    out = np.full((NUM_PENDING, n), ERROR, dtype=np.int8)
    high = np.concatenate(([0], np.cumsum(flat >= 0x80, dtype=np.int32)))
    wide = high[starts + lengths] > high[starts]
    out[DONE, ~wide] = DONE
    idx = np.flatnonzero(wide)
    state = np.repeat(np.arange(NUM_PENDING, dtype=np.int8)[:, None], len(idx), axis=1)
    pos = 0
    while len(idx):
        state = TABLE[state, flat[starts[idx] + pos]]
        pos += 1
        ended = lengths[idx] <= pos
        if ended.any():
            out[:, idx[ended]] = state[:, ended]
            idx, state = idx[~ended], state[:, ~ended]
    return out
