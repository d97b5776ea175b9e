"""A model whose logits are random: every step adversarial, so only the mask keeps an
output valid; a closing bias makes its outputs end."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from ..model_options import RandomOptions
from .base import (
    ForwardBatch,
    ModelRunner,
    RunnerOptions,
    RunnerRow,
    byte_counts,
    closing_bias,
    logit_positions,
)

#: distinct random logit rows the model draws from
POOL_ROWS = 64


class RandomLogitsRunner(ModelRunner):
    """Each row's logits at each position are one of `POOL_ROWS` fixed random vectors,
    chosen by a hash of the request's ``model_seed`` and the position: reproducible per
    request whatever else is in the batch, and cheap (one gather per step).

    The model grows impatient: once it has written more than `PATIENCE` tokens since
    its last closing token, the closing bias grows with every further token, so a
    string whose format lets it run on (a domain name, an identifier) still closes.
    Likewise past `PATIENCE` tokens since its last special token, the bias of the
    end-like special tokens (``</arg_value>``, stop tokens) grows: free text that only
    such a marker ends (markup values) holds quotes and brackets that count as closers
    without closing anything, and those few tokens would otherwise never outweigh the
    thousands of ordinary closers. And numbers stay short: past `MAX_DIGITS` digits in
    a row, tokens made only of digits are penalised more with every further one (a
    number followed by a comma, as in Python keyword arguments, has no closer to end
    it, and would otherwise run on for hundreds of digits).

    With ``ending_texts``, the model also leans towards writing those texts: the first
    token of each gets a small boost, and once an output ends with the beginning of
    one, its next token a large one. Free text that ends only at a literal spelled in
    ordinary tokens (an XML closing tag) would otherwise almost never end."""

    Options = RandomOptions
    own: RandomOptions
    #: drafts get logits as if the row had written them; nothing is held per position
    multi_token = True

    def __init__(self, tokenizer, options: RunnerOptions) -> None:
        super().__init__(tokenizer, options)
        rng = np.random.default_rng(options.seed)
        pool = rng.standard_normal((POOL_ROWS, self.vocab_rows), dtype=np.float32)
        bias = closing_bias(tokenizer, self.own.closing_bias)
        pool += bias
        self._pool = torch.from_numpy(pool).to(self.device)
        self._is_closer = bias > 0
        self._closers = torch.from_numpy(np.flatnonzero(self._is_closer)).to(self.device)
        self._is_special = np.zeros(self.vocab_rows, dtype=bool)
        specials = [t for t in tokenizer.special_tokens.values() if t < self.vocab_rows]
        self._is_special[specials] = True
        self._special_closers = torch.from_numpy(
            np.flatnonzero(self._is_closer & self._is_special)
        ).to(self.device)
        digits = np.zeros(self.vocab_rows, dtype=np.int64)
        count, length = byte_counts(tokenizer, (b"0123456789",))
        digits[: len(length)] = np.where((count == length) & (length > 0), length, 0)
        self._digits = digits
        self._digit_tokens = torch.from_numpy(np.flatnonzero(digits)).to(self.device)
        self._since: dict[str, list[int]] = {}  # request -> counters (see _grow_impatient)
        self._out = torch.empty(
            (options.max_num_seqs, self.vocab_rows), dtype=torch.float32, device=self.device
        )
        self._index = torch.empty(options.max_num_seqs, dtype=torch.int64)
        # for each ending text, the first token of each of its remainders
        self._endings = [t.encode("utf-8") for t in self.own.ending_texts if t]
        self._next_of: dict[bytes, int] = {}
        for text in self.own.ending_texts:
            for k in range(len(text)):
                self._next_of.setdefault(text[k:].encode("utf-8"), tokenizer.encode(text[k:])[0])
        self._ending_starts = sorted({self._next_of[e] for e in self._endings})
        self._token_bytes = tokenizer.token_bytes

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        at = logit_positions(batch)
        n = len(at)
        if n > self._out.shape[0]:  # drafts: several rows of logits per request
            self._out = torch.empty((n, self.vocab_rows), dtype=torch.float32, device=self.device)
            self._index = torch.empty(n, dtype=torch.int64)
        idx = self._index[:n].numpy()
        for i, (r, ahead) in enumerate(at):
            idx[i] = _mix(r.model_seed, len(r.output_ids) + len(ahead)) % POOL_ROWS
        out = self._out[:n]
        torch.index_select(self._pool, 0, self._index[:n].to(self.device), out=out)
        self._grow_impatient(at, out)
        if self._endings:
            self._lean_to_endings(at, out)
        if self.own.forward_ms > 0:
            time.sleep(self.own.forward_ms / 1000)
        return out

    def rollback(self, row: RunnerRow, k: int) -> None:
        """Nothing to forget: logits depend on the row's known tokens alone."""

    def remove(self, row: RunnerRow) -> None:
        self._since.pop(row.request_id, None)

    def _grow_impatient(self, at: Sequence[tuple[RunnerRow, Sequence[int]]], out) -> None:
        if self.own.closing_bias <= 0 or not len(self._closers):
            return
        is_closer, is_special, digits = self._is_closer, self._is_special, self._digits
        for i, (r, ahead) in enumerate(at):
            st = self._since.get(r.request_id)
            if st is None:  # tokens seen, since a closer, since a special token, digits
                st = self._since[r.request_id] = [0, 0, 0, 0]
            ids = r.output_ids
            for t in ids[st[0] :]:
                st[1] = 0 if is_closer[t] else st[1] + 1
                st[2] = 0 if is_special[t] else st[2] + 1
                st[3] = st[3] + digits[t] if digits[t] else 0
            st[0] = len(ids)
            closer, special, run = st[1], st[2], st[3]
            for t in ahead:  # drafts: counted for this position only
                closer = 0 if is_closer[t] else closer + 1
                special = 0 if is_special[t] else special + 1
                run = run + digits[t] if digits[t] else 0
            if run > MAX_DIGITS and len(self._digit_tokens):
                cut = -self.own.closing_bias * (run - MAX_DIGITS)
                d = self._digit_tokens
                out[i].index_add_(0, d, torch.full_like(d, cut, dtype=out.dtype))
            for since, which in ((closer, self._closers), (special, self._special_closers)):
                if since > PATIENCE and len(which):
                    extra = self.own.closing_bias * (since - PATIENCE) / PATIENCE
                    out[i].index_add_(0, which, torch.full_like(which, extra, dtype=out.dtype))

    def _lean_to_endings(self, at: Sequence[tuple[RunnerRow, Sequence[int]]], out) -> None:
        ri: list[int] = []
        ti: list[int] = []
        bonus: list[float] = []
        tb = self._token_bytes
        for i, (r, ahead) in enumerate(at):
            tail = b"".join(tb(t) for t in [*r.output_ids[-8:], *ahead][-8:])
            rest = _remainder(self._endings, tail)
            nxt = self._next_of.get(rest) if rest else None
            if nxt is not None:
                ri.append(i)
                ti.append(nxt)
                bonus.append(ENDING_CONTINUE_BIAS)
            else:
                ri += [i] * len(self._ending_starts)
                ti += self._ending_starts
                bonus += [ENDING_START_BIAS] * len(self._ending_starts)
        out.index_put_(
            (torch.tensor(ri, device=self.device), torch.tensor(ti, device=self.device)),
            torch.tensor(bonus, device=self.device),
            accumulate=True,
        )


#: tokens without a closing token before the closing bias starts to grow
PATIENCE = 16

#: digits in a row before digit tokens are penalised
MAX_DIGITS = 8

#: logit boosts towards `RandomOptions.ending_texts`
ENDING_START_BIAS = 4.0
ENDING_CONTINUE_BIAS = 14.0


def _remainder(endings: list[bytes], tail: bytes) -> bytes | None:
    """What is left to write of the ending whose longest beginning ``tail`` ends with."""
    best: tuple[int, bytes] | None = None
    for e in endings:
        for p in range(min(len(e) - 1, len(tail)), 0, -1):
            if tail.endswith(e[:p]):
                if best is None or p > best[0]:
                    best = (p, e[p:])
                break
    return best[1] if best is not None else None


def _mix(seed: int, position: int) -> int:
    """A cheap integer hash (splitmix64 finaliser) of (seed, position)."""
    x = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 29)
