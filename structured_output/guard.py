"""Two rules every constrained output keeps beyond its grammar, enforced at fill time.

1. **Whitespace runs are bounded.** No run of more than ``limit`` whitespace characters
   (space, tab, newline, carriage return) between the elements of constrained JSON.
   What counts is *structural* whitespace: whitespace outside JSON strings. Spaces
   inside a string are content (a code argument's indentation, an aligned table) and
   are never cut; a model that loops inside a string is stopped by ``max_tokens``, as
   any other string would be. This is the rule xgrammar's ``max_whitespace_cnt`` keeps,
   but the grammar does not carry it: a grammar with a bounded whitespace repetition at
   every gap of a JSON value makes each fill 2-3 times costlier than one with xgrammar's
   unbounded whitespace. So JSON is compiled unbounded, and the bound is a mask.
2. **The output is valid UTF-8.** A byte-level vocabulary splits characters between
   tokens, so a text can be ill-formed across a token boundary even where every token
   is fine alone. In raw text (below) the guard keeps the whole rule: it follows where
   the text stands in a UTF-8 sequence (`utf8.py`: whole, or which continuation bytes
   must come next) and masks every token that would make it ill-formed: one that
   starts with a continuation byte after a whole character, one without the
   continuation bytes a pending character needs or with a second byte out of its lead's
   range (overlong forms, encoded surrogates, code points past U+10FFFF), one
   ill-formed inside (a stray continuation byte, ``C0``, ``C1``, ``F5..FF``), and,
   while a character is pending, every special token (a stop token among them):
   its marker would follow the incomplete bytes. This is what xgrammar's byte-level
   regions (``any_text``, the text between a structural tag's triggers, the free text
   of XML-style parameters) do not enforce. In JSON text the grammar refuses all of
   these by itself but one: its character classes admit the encodings of the
   surrogates U+D800-U+DFFF (bytes ``ED A0..BF ..``), which a byte-level vocabulary
   reaches by writing ``ED`` at the end of one token and ``A0..BF`` at the start of the
   next. There, after a pending ``ED``, tokens that begin with ``A0..BF`` are masked
   (and a token that holds ``ED A0..BF`` always: no real vocabulary has one); the rest
   would cost each row of JSON text a hundred mask words for nothing. In JSON text,
   the same holds for escapes: a ``\\u`` escape of a surrogate must be a high one
   followed at once by a low one (``\\ud83d\\ude00``); a lone one (which JSON's
   grammar admits, strict parsers refuse, and no UTF-8 encoder can write back) is
   masked as it would begin. And a raw control character (U+0000 to U+001F) inside a
   string, which strict JSON parsers refuse, is masked where the grammar lets it in
   (xgrammar's length-bounded strings do); a grammar whose strings refuse it by
   themselves (`whitespace.refuses_control`: plain strings, JSON mode, JSON-only tags)
   gets each state's mask without those bans, and most states inside strings then need
   none at all.

Each matcher carries a small state (`GuardedMatcher.guard_state`): where the text it
has accepted stands lexically (`lexing.py`: outside a JSON string, inside one, in an
escape, or raw text that is not lexed), the length of the whitespace run it ends
with, and where it stands in a UTF-8 sequence (`utf8.py`). Accepting a token updates
it with one lookup in a per-token table. A fill then combines each row with the
precomputed mask of its state, vectorized over the batch: most states ban only a few
hundred tokens (those that hold a whitespace run longer than ``limit``, about 120 of
Qwen3's 151,669, outside JSON strings; those that start with a continuation byte or
are ill-formed, about 190, in raw text), a hundred-odd words per row; only a row whose
run already reached the limit, that stands inside a ``\\u`` escape, or that is in raw
text mid-character gets a whole-row mask.

JSON lexing is exact only where the constraint's text outside its JSON values is JSON
too (markers and literals with balanced quotes): JSON schemas, JSON objects, and
structural tags made of JSON values, literals and tokens. Other constraints are
matched as raw text (rule 2 only); a structural tag with free text in it (XML-style
parameters, Python literals) keeps the bound in its grammar instead
(`whitespace.bound_in_grammar`).

A whitespace run the grammar itself requires (a literal newline after ``limit``
spaces) is let through: a row whose mask would allow nothing keeps the grammar's mask.
So is an ill-formed sequence a grammar requires (a byte-level region that may not
continue a pending character); the state then starts over as if the text were whole.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import numpy as np
import xgrammar as xgr

from . import utf8
from .lexing import (
    ESCAPING,
    INVALID,
    NARROW,
    NUM_STATES,
    OUT,
    RAW,
    STR,
    WS,
    lex_tokens,
    step,
)
from .string_masks import PlainTables, kept_for
from .utf8 import AFTER_ED, DONE, ERROR, NUM_PENDING
from .vocab import pack_ids
from .whitespace import refuses_control

#: states whose masks are built at once (bounds the build's memory for long runs)
_BLOCK = 64
_NO_RUN = np.zeros(1, dtype=np.int64)


class GuardTable:
    """Per-token transitions and per-state masks of one vocabulary and one ``limit``
    (None: whitespace unbounded, UTF-8 guarded only).

    A state is ``q = (lex * P + pending) * K + run`` with ``K = limit + 1`` and ``P``
    the UTF-8 pending states (`utf8.py`); `state` and `decode` spell it out."""

    def __init__(
        self,
        token_bytes: Sequence[bytes],
        vocab_rows: int,
        *,
        special_ids: Collection[int] = (),
        limit: int | None,
    ) -> None:
        if limit is not None and limit < 0:
            raise ValueError("the whitespace limit must be >= 0 (None: no limit)")
        self.limit = limit
        self.vocab_rows = vocab_rows
        self.words = (vocab_rows + 31) // 32
        self.k = (limit if limit is not None else 0) + 1
        tb = list(token_bytes[:vocab_rows])
        tb += [b""] * (vocab_rows - len(tb))
        for i in special_ids:  # a special token is one marker: no bytes to lex
            if 0 <= i < vocab_rows:
                tb[i] = b""
        lex = lex_tokens(tb)
        cap = self.k - 1
        wide = NUM_STATES * NUM_PENDING * self.k > 1 << 15
        typecode, dtype = ("i", np.int32) if wide else ("h", np.int16)
        # ill-formed (let through only where the grammar required it): start over
        pending = np.where(lex["pending"] == ERROR, DONE, lex["pending"]).astype(np.int32)
        codes: list[array[int]] = []
        for s in range(NUM_STATES):
            # rows u of ``(next * P + pending[u]) * K + trail``
            rows = (lex["next"][s].astype(np.int32) * NUM_PENDING + pending) * self.k
            rows += np.minimum(lex["trail"][s], cap)
            if s == OUT:
                rows[DONE] = np.where(lex["pure"][OUT], -lex["len"], rows[DONE])
            rows = rows.astype(dtype)
            for u in range(NUM_PENDING):
                if u != DONE and s in ESCAPING:  # unreachable: an escape is ASCII
                    codes.append(codes[s * NUM_PENDING])
                else:
                    codes.append(array(typecode, rows[u].tobytes()))
        #: per lexical and pending state (``q // K``), per token: the next state, or
        #: ``-n`` for a token of ``n`` whitespace characters outside strings from ``OUT``
        #: with nothing pending (``q < K``: the run ``q`` grows by ``n``)
        self.codes = codes
        self.cap = cap
        self.start_json = self.state(OUT)
        self.start_raw = self.state(RAW)
        self._build_masks(lex)
        #: which tokens keep a free string's mask (`string_masks`), built when needed
        self.plain = PlainTables(tb, vocab_rows)
        #: per ``state // k``, ``1`` per token that leaves a string from there, or may
        #: (`lexing.lex_tokens`' ``left``): where a string's memo ends
        left = [lex["left"][s].tobytes() for s in range(NUM_STATES)]
        self.leaves = [left[s] for s in range(NUM_STATES) for _ in range(NUM_PENDING)]
        #: per ``state // k``: mid-escape or mid-character, where a string's text may
        #: resume with a token that is plain (the ``there`` after ``\\``)
        self.mid_text = bytes(
            int(lex in ESCAPING or (lex in (STR, RAW) and pending != DONE))
            for lex in range(NUM_STATES)
            for pending in range(NUM_PENDING)
        )
        self.plain.warm()

    def state(self, lex: int, run: int = 0, pending: int = DONE) -> int:
        return (lex * NUM_PENDING + pending) * self.k + run

    def decode(self, q: int) -> tuple[int, int, int]:
        """``(lex, run, pending)`` of state ``q``."""
        su, run = divmod(q, self.k)
        lex, pending = divmod(su, NUM_PENDING)
        return lex, run, pending

    # ----- per token, in Python (one call per accepted token) -------------------

    def advance(self, q: int, token_id: int) -> int:
        c = self.codes[q // self.k][token_id]
        return c if c >= 0 else min(q - c, self.cap)

    def advance_bytes(self, q: int, data: bytes) -> int:
        """The state after ``data`` (a string the matcher accepted; rare)."""
        if not data:
            return q
        lex, run, pending = self.decode(q)
        pending = utf8.run_bytes(pending, data)
        for byte in data:
            if lex == OUT and byte in WS:
                run = min(run + 1, self.cap)
                continue
            run = 0
            lex = step(lex, byte)
            if lex == INVALID:
                lex = STR  # only where the grammar itself required it (see `apply`)
        return self.state(lex, run, DONE if pending == ERROR else pending)

    # ----- masks -------------------------------------------------------------------

    def _rows(
        self, lex: dict[str, Any]
    ) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
        """The allowed tokens of every reachable state, in the order of the states, a
        block at a time: ``(lex, pending, runs, ok, ctrl)``, ``ok[i]`` the tokens
        allowed with that lexical and pending state and a whitespace run of ``runs[i]``
        (bool ``[len(runs), vocab_rows]``), ``ctrl`` the tokens refused there for a raw
        control character in a string (which some grammars refuse by themselves). A run
        is counted outside strings, after whole text, and an escape is ASCII: other
        states are unreachable."""
        limit = self.limit
        first = lex["first"]
        starts_hi = (first >= 0xA0) & (first <= 0xBF)
        surrogate = lex["surrogate"]  # never in a real vocabulary
        for s in range(NUM_STATES):
            for u in range(NUM_PENDING):
                if u != DONE and s in ESCAPING:
                    continue
                ok = ~lex["invalid"][s]
                ctrl = lex["ctrl"][s]
                if s == RAW:
                    ok &= lex["pending"][u] != ERROR
                else:  # the grammar of JSON text refuses all but a surrogate by itself
                    ok &= ~surrogate
                    if u == AFTER_ED:
                        ok &= ~starts_hi
                if limit is None or s == RAW:
                    yield s, u, _NO_RUN, ok[None, :], ctrl
                    continue
                ok &= lex["inner"][s] <= limit
                if s != OUT:
                    yield s, u, _NO_RUN, ok[None, :], ctrl
                    continue
                lead = lex["lead"][OUT]
                for r0 in range(0, self.k if u == DONE else 1, _BLOCK):
                    runs = np.arange(r0, min(self.k if u == DONE else 1, r0 + _BLOCK))
                    ok_runs = ok[None, :] & (lead[None, :] <= (limit - runs)[:, None])
                    yield s, u, runs, ok_runs, ctrl

    def _build_masks(self, lex: dict[str, Any]) -> None:
        limit = self.limit
        #: every byte is a token: a banned token's first byte is then always allowed
        #: unless the run is at the limit, so only such rows can end up empty
        complete = lex["single_bytes"] == 256
        n = NUM_STATES * NUM_PENDING * self.k
        # Masks are kept per key: ``q`` for state ``q`` of a grammar that may write raw
        # control characters in strings, ``q + n`` for the same state of one whose
        # strings refuse them by themselves (`refuses_control`): without those bans,
        # most states inside strings need no mask, and the one outside them bans a
        # quarter of the words.
        needs = np.zeros(2 * n, dtype=bool)
        may_empty = np.zeros(2 * n, dtype=bool)
        masks: list[np.ndarray] = []
        index = np.full(2 * n, -1, dtype=np.int64)
        seen: dict[bytes, int] = {}
        all_ones = np.uint32(0xFFFFFFFF)
        for s, u, runs, ok, ctrl in self._rows(lex):
            strict = _pack(ok, self.words)
            lenient = strict | pack_ids(ctrl, self.words) if ctrl.any() else strict
            for variant, packed in enumerate((strict, lenient)):
                restricts = (packed != all_ones).any(axis=1).tolist()
                for i, run in enumerate(runs.tolist()):
                    if not restricts[i]:
                        continue  # allows everything
                    key = self.state(s, run, u) + variant * n
                    needs[key] = True
                    # A row can end up allowing nothing only where a single byte may
                    # be banned: a grammar that allows a token allows its first byte, a
                    # token of its own (``complete``), which is banned only at the
                    # whitespace limit or where a surrogate escape must go on one way
                    may_empty[key] = (
                        not complete
                        or (s == OUT and limit is not None and run >= limit)
                        or s in NARROW
                        or (s == RAW and u != DONE)
                    )
                    index[key] = seen.setdefault(packed[i].tobytes(), len(masks))
                    if index[key] == len(masks):
                        masks.append(packed[i])
        #: per state, whether it needs a mask (then ``needs_lenient``: where the
        #: grammar refuses raw control characters in strings by itself)
        self.needs, self.needs_lenient = needs[:n], needs[n:]
        self._num_states = n
        #: each distinct mask once, as a whole row (a few dozen: about 1 MB): one AND
        #: over a row's words costs less than a gather and scatter of a few dozen
        self._masks = np.stack(masks) if masks else np.zeros((0, self.words), np.uint32)
        #: per key: its mask (a view of ``_masks``) or None, and whether it may empty a row
        views = list(self._masks)
        self._mask_list = [views[i] if i >= 0 else None for i in index.tolist()]
        self._may_empty_list = may_empty.tolist()

    def allowed(self, q: int, lenient: bool = False) -> np.ndarray:
        """The mask of state ``q`` as uint32 words (tests and single rows); ``lenient``:
        for a grammar that refuses raw control characters in strings by itself."""
        mask = self._mask_list[q + self._num_states if lenient else q]
        return np.full(self.words, 0xFFFFFFFF, np.uint32) if mask is None else mask.copy()

    def apply_one(self, view: np.ndarray, row: int, q: int, lenient: bool = False) -> bool:
        """AND row ``row`` of ``view`` (uint32 ``[R, W]``) with the mask of state ``q``
        (`apply_row`). Whether the state has a mask."""
        return self.apply_row(view[row], q, lenient) if q >= 0 else False

    def apply_row(self, words: np.ndarray, q: int, lenient: bool = False) -> bool:
        """AND ``words`` (one row, uint32 ``[W]``) with the mask of state ``q`` (-1:
        none) of a matcher whose grammar refuses raw control characters in strings
        (``lenient``) or not; a row that would allow nothing keeps its grammar's mask.
        Whether the state has a mask."""
        if q < 0:
            return False
        if lenient:
            q += self._num_states
        mask = self._mask_list[q]
        if mask is None:
            return False
        if self._may_empty_list[q]:  # rare: keep the grammar's mask rather than none
            sub = words & mask
            if sub.any():
                words[:] = sub
        else:
            words &= mask
        return True


class GuardedGrammar(xgr.CompiledGrammar):
    """A compiled grammar that knows whether its text is JSON text (`whitespace.py`):
    a matcher of it lexes its output as JSON (whitespace bounded and UTF-8 guarded) or
    as raw text (UTF-8 guarded only). It also knows the ids it names as tokens (its
    markers), read once here, at compile time, for jump forward
    (`jump_forward.named_token_ids`)."""

    json_text: bool
    #: JSON text whose strings refuse raw control characters by themselves
    #: (`refuses_control`): the guard need not mask them
    refuses_control: bool
    #: the ids of its token-level elements; None: any token may be one
    token_ids: tuple[int, ...] | None

    @classmethod
    def wrap(cls, grammar: xgr.CompiledGrammar, json_text: bool) -> GuardedGrammar:
        from .jump_forward import named_token_ids

        g = cls._create_from_handle(grammar._handle)
        assert isinstance(g, GuardedGrammar)
        g.json_text = json_text
        g.refuses_control = json_text and refuses_control(str(grammar.grammar))
        g.token_ids = named_token_ids(grammar)
        return g


class GuardedMatcher(xgr.GrammarMatcher):
    """A `xgrammar.GrammarMatcher` that keeps its guard state (`GuardTable`) through
    every accept and rollback. Its own ``fill_next_token_bitmask`` applies the guard
    to the row it fills; `bitmask.BitmaskFiller` fills many rows and applies the guard
    to all of them at once."""

    def __init__(
        self,
        compiled_grammar: xgr.CompiledGrammar,
        guard: GuardTable,
        *,
        json_text: bool,
        override_stop_tokens: Sequence[int] | None = None,
        keep_strings: bool = True,
    ) -> None:
        stops = None if override_stop_tokens is None else list(override_stop_tokens)
        super().__init__(compiled_grammar, override_stop_tokens=stops)
        #: the tokens it ends on (xgrammar's list, read once)
        self.stops = tuple(self.stop_token_ids)
        self.guard = guard
        self._h = self._handle
        self._codes = guard.codes
        self._k = guard.k
        self._cap = guard.cap
        self._start = guard.start_json if json_text else guard.start_raw
        #: see `GuardTable`
        self.guard_state = self._start
        #: its JSON strings refuse raw control characters by themselves
        self.guard_lenient = json_text and bool(getattr(compiled_grammar, "refuses_control", 0))
        self._history: list[int] = []
        # a mask kept inside a free string (`string_masks`): ``keep`` while the grammar
        # stands where ``kept`` was filled; ``probe`` after a token that may begin one
        self._kept = kept_for(compiled_grammar, guard.plain)
        # keep_strings=False (a bench's comparison): every token plain, none checked
        self._any = self._table = self._kept.any_plain if keep_strings else guard.plain.every
        self._keeps = int(keep_strings)
        self._check_at = (STR if json_text else RAW) * NUM_PENDING + DONE
        self.kept: np.ndarray | None = None
        self.keep = 0
        self.probe = self._keeps
        #: check after the next token, plain or not: the last check found the text
        #: mid-escape, or the matcher was reset, rolled back or jumped forward
        self.rearm = self._keeps
        #: masks by parser points within the free string being written (JSON only: its
        #: lexer sees where the string ends), see `string_masks.memo_key`
        self.memo: dict | None = None
        self.guard_lexes_strings = json_text
        self._leaves = guard.leaves

    def accept_token(self, token_id: int, *, debug_print: bool = False) -> bool:
        if not self._h.accept_token(token_id, debug_print):
            return False
        q = self.guard_state
        self._history.append(q)
        c = self._codes[q // self._k][token_id]
        self.guard_state = c if c >= 0 else min(q - c, self._cap)
        if self.memo is not None and self._leaves[q // self._k][token_id]:
            self.memo = None  # the string ended (and another may have begun: ``":"``)
        if self._table[token_id]:
            self.probe = self.rearm
        else:  # it may begin or resume a string (or left a kept one): check after a fill
            self.keep, self.probe, self._table = 0, self._keeps, self._any
        return True

    def _forget(self) -> None:
        self.keep = 0
        self.probe = self.rearm = self._keeps
        self._table, self.memo = self._any, None

    def accept_string(self, input_str: str | bytes, *, debug_print: bool = False) -> bool:
        if not self._h.accept_string(input_str, debug_print):
            return False
        data = input_str.encode("utf-8") if isinstance(input_str, str) else bytes(input_str)
        self._history.append(self.guard_state)
        self.guard_state = self.guard.advance_bytes(self.guard_state, data)
        self._forget()
        return True

    def rollback(self, num_tokens: int = 1) -> None:
        self._h.rollback(num_tokens)
        if num_tokens > 0:
            self.guard_state = self._history[-num_tokens]
            del self._history[-num_tokens:]
            self._forget()

    def reset(self) -> None:
        self._h.reset()
        self.guard_state = self._start
        self._history.clear()
        self._forget()

    def fill_next_token_bitmask(
        self, bitmask: Any, index: int = 0, *, debug_print: bool = False
    ) -> bool:
        restricts = super().fill_next_token_bitmask(bitmask, index, debug_print=debug_print)
        view = (bitmask.numpy() if hasattr(bitmask, "numpy") else np.asarray(bitmask)).view(
            np.uint32
        )
        if view.ndim == 1:
            view = view.reshape(1, -1)
        applied = self.guard.apply_one(view, index, self.guard_state, self.guard_lenient)
        return applied or restricts


# ----- building the tables -------------------------------------------------------------


def _pack(flags: np.ndarray, words: int) -> np.ndarray:
    """bool ``[R, N]`` -> uint32 ``[R, words]``, bit ``t % 32`` of word ``t // 32`` for
    column ``t``, the bits past ``N`` set."""
    padded = np.ones((flags.shape[0], words * 32), dtype=bool)
    padded[:, : flags.shape[1]] = flags
    return np.packbits(padded, axis=1, bitorder="little").view(np.uint32)
