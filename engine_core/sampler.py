"""Sampling with grammar masks: greedy, temperature, top-k, top-p, seeds.

Every row draws exactly one uniform number per step (from its own generator when
the request has a seed), and turns it into a token by inverse CDF over the allowed
tokens; so the same seed gives the same tokens whatever else is in the batch.

On a CPU, full-vocabulary ``torch.multinomial`` costs about 1.5 s at batch 256, and
masking every logit costs more than filling the mask. So a constrained row that
allows few tokens is sampled from those tokens alone (`structured_output.apply`
lists them from the bitmask); other rows go through one batched full-vocabulary
pass. On a GPU the mask is applied by xgrammar's kernel and everything stays there.

A row with top-k or top-p never sorts its vocabulary: it draws from a partial top-k
of its logits (``top_k`` of them, or `Sampler.top_p_candidates` for top-p alone,
grown only for a row whose top-p mass lies beyond them). Top-k and top-p are defined
once, in `sampling_math.draw_sorted`, for this path and the sparse one alike.

Two kernels run the full-vocabulary passes: ``numpy`` (a CPU: in place, run by run of
consecutive rows) and ``torch`` (any device; the default off the CPU). Both run on CPU
tensors too, so that both are tested here.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from structured_output.apply import allowed_counts, allowed_ids, apply_bitmask_inplace
from structured_output.bitmask import FilledMask

from .sampling_math import (
    TopPScratch,
    draw_candidates,
    draw_sorted,
    inverse_cdf_np,
    inverse_cdf_np_rows,
    inverse_cdf_torch,
    top_p_candidates_np,
    topk_rows,
    weights_np,
    weights_torch,
)

_EMPTY = np.empty(0, dtype=np.int64)
#: from this many rows masked in place, or drawn from the whole vocabulary, on a CPU,
#: a helper thread takes half of them
_SPLIT_ROWS = 16


@dataclass(slots=True)
class SamplingBatch:
    """One step's per-row settings, in batch-row order."""

    temperature: np.ndarray  # float32 [n]; <= 0 means greedy
    top_p: np.ndarray  # float32 [n]; 1 means off
    top_k: np.ndarray  # int64 [n]; 0 means off
    uniforms: np.ndarray  # float64 [n] in [0, 1): this step's draw per row


@dataclass(slots=True)
class StepConstraints:
    """What restricts this step's rows beyond the model's logits."""

    mask: FilledMask | None = None
    #: (row, id) pairs to forbid; lifted for a row where they would forbid everything
    ban_rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    ban_ids: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: rows whose token is imposed (a reasoning budget ran out)
    forced_rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    forced_ids: np.ndarray = field(default_factory=lambda: _EMPTY)


class Sampler:
    """Turns a step's logits into one token per row (-1: the row allowed nothing)."""

    KERNELS = ("numpy", "torch")

    def __init__(
        self,
        vocab_rows: int,
        *,
        max_sparse_ids: int | None = None,
        top_p_candidates: int = 1024,
        kernel: str | None = None,
    ):
        self.vocab_rows = vocab_rows
        #: a mask row that allows at most this many ids is sampled from them alone
        #: (default: a sixteenth of the vocabulary); the others are masked in place
        #: and go through the full-vocabulary pass (numpy kernel only)
        self.max_sparse_ids = vocab_rows // 16 if max_sparse_ids is None else max_sparse_ids
        #: torch kernel: a top-p row without top-k draws from its this many most likely
        #: ids, or from 16 times as many (then all) when they hold less than its top-p
        #: mass (the numpy kernel finds how many it needs from a histogram instead)
        self.top_p_candidates = top_p_candidates
        if kernel is not None and kernel not in self.KERNELS:
            raise ValueError(f"unknown sampler kernel {kernel!r}; known: {self.KERNELS}")
        #: ``numpy`` or ``torch``; None: numpy for CPU logits, torch elsewhere
        self.kernel = kernel
        self._scratch: TopPScratch | None = None
        self._helper: ThreadPoolExecutor | None = None  # started by the first split

    def _numpy(self, logits: torch.Tensor) -> bool:
        if self.kernel is None:
            return logits.device.type == "cpu"
        if self.kernel == "numpy" and logits.device.type != "cpu":
            raise ValueError("the numpy sampler kernel needs CPU logits")
        return self.kernel == "numpy"

    def sample(
        self, logits: torch.Tensor, batch: SamplingBatch, cons: StepConstraints
    ) -> np.ndarray:
        """One token per row of ``logits`` ``[n, vocab_rows]`` (edited in place)."""
        n = logits.shape[0]
        use_np = self._numpy(logits)
        tokens = np.empty(n, dtype=np.int64)
        full = np.ones(n, dtype=bool)
        masked = np.zeros(n, dtype=bool)
        if cons.mask is not None and len(cons.mask.rows):
            rows = cons.mask.rows
            if use_np:
                words = cons.mask.buffer.numpy()[rows].view(np.uint32)
                small = allowed_counts(words) <= self.max_sparse_ids
                sparse_rows = rows[small]
                if len(sparse_rows):
                    tokens[sparse_rows] = self._sample_sparse(
                        logits.numpy(), sparse_rows, words[small], batch, cons
                    )
                    full[sparse_rows] = False
                # Rows that allow most of the vocabulary mask few logits: xgrammar's
                # CPU kernel is fast for those (its cost grows with the masked count).
                self.mask_in_place(logits, cons.mask.buffer, rows[~small])
                masked[rows[~small]] = True
            else:
                hi = int(rows.max()) + 1
                mask_dev = cons.mask.buffer[:hi].to(logits.device, non_blocking=True)
                apply_bitmask_inplace(logits, mask_dev, rows)
                masked[rows] = True
        full_rows = np.flatnonzero(full)
        if len(full_rows):
            self._ban(logits, cons, full, masked, use_np)
            tokens[full_rows] = self._sample_full(logits, full_rows, batch, use_np)
        if len(cons.forced_rows):
            tokens[cons.forced_rows] = cons.forced_ids
        return tokens

    def mask_in_place(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: np.ndarray) -> None:
        """Masks ``rows`` of CPU ``logits`` in place with xgrammar's kernel, which frees
        the GIL: many rows are split with a helper thread (the forward pass is over, so
        the CPU is otherwise idle)."""
        if len(rows) < _SPLIT_ROWS:
            apply_bitmask_inplace(logits, bitmask, rows)
        else:
            self._halves(lambda a, b: apply_bitmask_inplace(logits, bitmask, rows[a:b]), len(rows))

    def draw_all_np(self, z: np.ndarray, inv_t: np.ndarray, u: np.ndarray) -> np.ndarray:
        """`inverse_cdf_np` over every row of CPU logits ``z`` (in place), many rows
        split with the helper thread: numpy frees the GIL over such wide rows, and
        each row's draw is its own, so the tokens are those of one call."""
        if len(z) < _SPLIT_ROWS:
            return inverse_cdf_np(z, inv_t, u)
        return np.concatenate(
            self._halves(lambda a, b: inverse_cdf_np(z[a:b], inv_t[a:b], u[a:b]), len(z))
        )

    def _halves(self, work: Callable[[int, int], Any], n: int) -> tuple[Any, Any]:
        """``work(0, n // 2)`` on the helper thread and ``work(n // 2, n)`` on this one;
        both results. The helper's half is done (or failed) before this returns or
        raises: nobody reads the rows while it still writes them."""
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="thinkgate-mask")
        half = n // 2
        other = self._helper.submit(work, 0, half)
        try:
            mine = work(half, n)
        finally:
            first = other.result()
        return first, mine

    def close(self) -> None:
        """Let the helper thread go (a later mask starts another)."""
        if self._helper is not None:
            self._helper.shutdown(wait=False)
            self._helper = None

    def _ban(
        self,
        logits: torch.Tensor,
        cons: StepConstraints,
        full: np.ndarray,
        masked: np.ndarray,
        use_np: bool,
    ) -> None:
        """Forbid the (row, id) bans of full-vocabulary rows, except in a row where
        they would forbid everything (only a masked row can come to that)."""
        if not len(cons.ban_rows):
            return
        sel = full[cons.ban_rows]
        if not sel.any():
            return
        rows, ids = cons.ban_rows[sel], cons.ban_ids[sel]
        if use_np:
            x = logits.numpy()
            saved = x[rows, ids].copy()
            x[rows, ids] = -np.inf
            for r in np.unique(rows[masked[rows]]):
                if x[r].max() == -np.inf:
                    here = rows == r
                    x[r, ids[here]] = saved[here]
            return
        dev = logits.device
        r = torch.from_numpy(rows).to(dev)
        i = torch.from_numpy(ids).to(dev)
        saved_t = logits[r, i].clone()
        logits[r, i] = float("-inf")
        check = torch.from_numpy(np.unique(rows[masked[rows]])).to(dev)
        if len(check):
            dead = check[torch.isinf(logits[check]).all(dim=1)]
            if len(dead):
                lift = torch.isin(r, dead)
                logits[r[lift], i[lift]] = saved_t[lift]

    def _sample_full(
        self, logits: torch.Tensor, rows: np.ndarray, batch: SamplingBatch, use_np: bool
    ) -> np.ndarray:
        """Sample rows ``rows`` of ``logits`` over the whole vocabulary (masked ids are
        -inf already). Rows are edited in place."""
        n = logits.shape[0]
        dev = logits.device
        arr = logits.numpy() if use_np else logits
        temp = batch.temperature[rows]
        out = np.empty(len(rows), dtype=np.int64)
        greedy = temp <= 0
        if greedy.any():  # the best id; -1 where nothing is allowed
            g = rows[greedy]
            if use_np:
                z = arr if len(g) == n else arr[g]
                best = z.argmax(axis=1)
                top = z[np.arange(len(g)), best]
            else:
                zt = logits if len(g) == n else logits[torch.from_numpy(g).to(dev)]
                top_t, best_t = zt.max(dim=1)
                best, top = best_t.cpu().numpy(), top_t.cpu().numpy()
            out[greedy] = np.where(np.isneginf(top), -1, best)
        rnd = np.flatnonzero(~greedy)
        if not len(rnd):
            return out
        r = rows[rnd]
        cut = (batch.top_k[r] > 0) | (batch.top_p[r] < 1)
        trimmed = r[cut]
        if len(trimmed):
            out[rnd[cut]] = self._sample_trimmed(
                logits, trimmed, 1.0 / temp[rnd[cut]], batch, use_np
            )
        plain = r[~cut]
        if not len(plain):  # temperature only: straight from the logits, in place
            return out
        inv_t = 1.0 / temp[rnd[~cut]]
        u = batch.uniforms[plain]
        if 8 * len(plain) >= 7 * n:
            # Nearly every row: one pass over all rows in place (the others' logits
            # are no longer needed). With fewer rows, a CPU runs the pass in place
            # on each run of consecutive rows: a gathered copy of the rows would
            # cost a fresh allocation the size of the rows, page faults included,
            # about as much as the pass itself.
            inv_all, u_all = np.ones(n), np.zeros(n)
            inv_all[plain], u_all[plain] = inv_t, u
            drawn = (
                self.draw_all_np(arr, inv_all, u_all)
                if use_np
                else inverse_cdf_torch(arr, inv_all, u_all)
            )
            out[rnd[~cut]] = drawn[plain]
        elif use_np:
            out[rnd[~cut]] = inverse_cdf_np_rows(arr, plain, inv_t, u)
        else:
            out[rnd[~cut]] = inverse_cdf_torch(logits[torch.from_numpy(plain).to(dev)], inv_t, u)
        return out

    def _sample_trimmed(
        self,
        logits: torch.Tensor,
        rows: np.ndarray,
        inv_t: np.ndarray,
        batch: SamplingBatch,
        use_np: bool,
    ) -> np.ndarray:
        """Rows ``rows`` (ascending) with top-k or top-p, drawn from a partial top-k
        of their logits, never a sort of the vocabulary: a top-k row from its
        ``top_k`` best ids; a top-p row from its `top_p_candidates` most likely ids,
        16 times as many for a row whose top-p mass lies beyond them, and all of them
        only past that. Rows of one candidate count share one call (so a row's
        candidates, and its draw, never depend on the rest of the batch)."""
        vocab = logits.shape[1]
        top_k, top_p, u = batch.top_k[rows], batch.top_p[rows], batch.uniforms[rows]
        k = np.where((top_k > 0) & (top_k < vocab), top_k, 0)
        out = np.full(len(rows), -1, dtype=np.int64)
        by_k = np.flatnonzero(k > 0)
        for kk in np.unique(k[by_k]).tolist():
            sel = by_k[k[by_k] == kk]
            vals, ids = topk_rows(logits, rows[sel], kk, in_place=use_np)
            top = vals[:, :1].copy()
            top[~np.isfinite(top)] = 0.0  # a row with nothing allowed: all weights 0
            w = vals - top
            w *= inv_t[sel, None]
            np.exp(w, out=w)
            out[sel] = draw_candidates(w, ids, k[sel], top_p[sel], u[sel])[0]
        by_p = np.flatnonzero(k == 0)
        if not len(by_p):
            return out
        # top-p alone: the rows become their weights, whose mass top-p needs
        p_rows = rows[by_p]
        if use_np:
            x = logits.numpy()
            mass = weights_np(x, p_rows, inv_t[by_p])
            # one row at a time: each is a few vector passes over the row (a batched
            # form would need scratch the size of the rows, and gains nothing here)
            if self._scratch is None:
                self._scratch = TopPScratch(vocab)
            w_parts, id_parts = [], []
            for i, r in enumerate(p_rows.tolist()):
                w, ids = top_p_candidates_np(x, r, mass[i], float(top_p[by_p[i]]), self._scratch)
                w_parts.append(w)
                id_parts.append(ids)
            counts = np.fromiter((len(w) for w in w_parts), np.int64, len(w_parts))
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            sel = by_p
            pos, _ = draw_sorted(
                np.concatenate(w_parts), starts, counts, k[sel], top_p[sel], u[sel], mass
            )
            flat = np.concatenate(id_parts)
            out[sel] = np.where(pos >= 0, flat[np.maximum(pos, 0)], -1)
            return out
        src = logits.index_select(0, torch.from_numpy(p_rows).to(logits.device))
        mass = weights_torch(src, inv_t[by_p])
        pending = np.arange(len(by_p))
        cand = min(self.top_p_candidates, vocab)
        while len(pending):
            sel = by_p[pending]
            w, ids = topk_rows(src, pending, cand, in_place=False)
            tok, short = draw_candidates(w, ids, k[sel], top_p[sel], u[sel], mass[pending])
            if cand >= vocab:
                short[:] = False
            out[sel[~short]] = tok[~short]
            pending = pending[short]
            cand = min(vocab, cand * 16)
        return out

    def _sample_sparse(
        self,
        x: np.ndarray,
        rows: np.ndarray,
        words: np.ndarray,
        batch: SamplingBatch,
        cons: StepConstraints,
    ) -> np.ndarray:
        """Sample rows ``rows`` from their allowed ids only."""
        m = len(rows)
        result = np.full(m, -1, dtype=np.int64)
        seg, tok = allowed_ids(words, x.shape[1])
        if not len(seg):
            return result
        vals = x[rows[seg], tok].astype(np.float64)
        if len(cons.ban_rows):
            pos = np.full(x.shape[0], -1, dtype=np.int64)
            pos[rows] = np.arange(m)
            b_seg = pos[cons.ban_rows]
            ok = b_seg >= 0
            banned_codes = b_seg[ok] * x.shape[1] + cons.ban_ids[ok]
            if len(banned_codes):
                hit = np.isin(seg * x.shape[1] + tok, banned_codes)
                if hit.any():
                    banned = np.where(hit, -np.inf, vals)
                    seg_ok = np.zeros(m, dtype=bool)
                    seg_ok[seg[np.isfinite(banned)]] = True
                    # keep a row's bans only where something else stays allowed
                    vals = np.where(seg_ok[seg], banned, vals)
        temp = batch.temperature[rows].astype(np.float64)
        greedy = temp <= 0
        z = vals / np.where(greedy, 1.0, temp)[seg]
        order = np.lexsort((tok, -z, seg))  # heaviest first in each row, ties by id
        seg, tok, z = seg[order], tok[order], z[order]
        counts = np.bincount(seg, minlength=m)
        present = counts > 0
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        # greedy rows: the best allowed token
        result[present] = tok[starts[present]]
        rnd = np.flatnonzero(present & ~greedy)
        if not len(rnd):
            return result
        w = z - z[starts[seg]]
        np.exp(w, out=w)
        w[~np.isfinite(z)] = 0.0
        rr = rows[rnd]
        pos, _ = draw_sorted(
            w,
            starts[rnd],
            counts[rnd],
            batch.top_k[rr],
            batch.top_p[rr],
            batch.uniforms[rr],
        )
        result[rnd] = np.where(pos >= 0, tok[np.maximum(pos, 0)], -1)
        return result
