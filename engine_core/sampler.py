"""Sampling with grammar masks: greedy, temperature, top-k, top-p, seeds.

Every row draws exactly one uniform number per step (from its own generator when
the request has a seed), and turns it into a token by inverse CDF over the allowed
tokens; so the same seed gives the same tokens whatever else is in the batch.

On a CPU, full-vocabulary ``torch.multinomial`` costs about 1.5 s at batch 256, and
masking every logit costs more than filling the mask. So a constrained row that
allows few tokens is sampled from those tokens alone (`structured_output.apply`
lists them from the bitmask); other rows go through one batched full-vocabulary
pass. On a GPU the mask is applied by xgrammar's kernel and everything stays there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from structured_output.apply import allowed_ids, apply_bitmask_inplace, dense_mask, words_in_use
from structured_output.bitmask import FilledMask

_EMPTY = np.empty(0, dtype=np.int64)


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

    def __init__(self, vocab_rows: int, *, max_sparse_words: int = 128, top_p_candidates: int = 1024):
        self.vocab_rows = vocab_rows
        #: a mask row with at most this many non-zero 32-bit words is sampled sparsely
        self.max_sparse_words = max_sparse_words
        self.top_p_candidates = top_p_candidates

    def sample(self, logits: torch.Tensor, batch: SamplingBatch, cons: StepConstraints) -> np.ndarray:
        if logits.device.type == "cpu":
            tokens = self._sample_cpu(logits, batch, cons)
        else:
            tokens = self._sample_device(logits, batch, cons)
        if len(cons.forced_rows):
            tokens[cons.forced_rows] = cons.forced_ids
        return tokens

    # ----- CPU ---------------------------------------------------------------

    def _sample_cpu(self, logits: torch.Tensor, batch: SamplingBatch, cons: StepConstraints) -> np.ndarray:
        n, vocab = logits.shape
        x = logits.numpy()
        tokens = np.empty(n, dtype=np.int64)
        sparse_rows = _EMPTY
        is_sparse = np.zeros(n, dtype=bool)
        if cons.mask is not None and len(cons.mask.rows):
            rows = cons.mask.rows
            words = cons.mask.buffer.numpy()[rows].view(np.uint32)
            small = words_in_use(words) <= self.max_sparse_words
            sparse_rows = rows[small]
            is_sparse[sparse_rows] = True
            dense_rows = rows[~small]
            if len(dense_rows):
                allowed = dense_mask(words[~small], vocab)
                x[dense_rows] = np.where(allowed, x[dense_rows], -np.inf)
            if len(sparse_rows):
                tokens[sparse_rows] = self._sample_sparse(x, sparse_rows, words[small], batch, cons)
        full_rows = np.flatnonzero(~is_sparse)
        if len(full_rows):
            self._ban_full(x, cons, is_sparse)
            z = logits if len(full_rows) == n else logits[torch.from_numpy(full_rows)]
            tokens[full_rows] = self._sample_full(z, batch, full_rows).numpy()
        return tokens

    def _ban_full(self, x: np.ndarray, cons: StepConstraints, is_sparse: np.ndarray) -> None:
        if not len(cons.ban_rows):
            return
        sel = ~is_sparse[cons.ban_rows]
        rows, ids = cons.ban_rows[sel], cons.ban_ids[sel]
        if not len(rows):
            return
        saved = x[rows, ids].copy()
        x[rows, ids] = -np.inf
        for r in np.unique(rows):
            if not np.isfinite(x[r]).any():  # the bans forbade everything: lift them
                x[r, ids[rows == r]] = saved[rows == r]

    def _sample_full(self, z: torch.Tensor, batch: SamplingBatch, rows: np.ndarray) -> torch.Tensor:
        """Rows of logits ``z`` (``rows`` says which batch rows they are) to tokens."""
        temp = torch.from_numpy(batch.temperature[rows])
        greedy = temp <= 0
        out = torch.empty(len(rows), dtype=torch.int64)
        if bool(greedy.any()):
            out[greedy] = z[greedy].argmax(dim=1)
        if bool(greedy.all()):
            return out
        rnd = ~greedy
        idx = torch.nonzero(rnd).squeeze(1)
        zz = z if len(idx) == len(rows) else z[idx]
        zz = zz / temp[idx].unsqueeze(1).to(zz.dtype)  # a new tensor: safe to edit below
        zz = self._top_k_top_p(zz, batch.top_k[rows][idx.numpy()], batch.top_p[rows][idx.numpy()])
        probs = torch.softmax(zz, dim=1)
        cdf = torch.cumsum(probs, dim=1)
        u = torch.from_numpy(batch.uniforms[rows][idx.numpy()]).to(cdf.dtype)
        target = (u * cdf[:, -1]).unsqueeze(1)
        pick = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=zz.shape[1] - 1)
        bad = probs.gather(1, pick.unsqueeze(1)).squeeze(1) <= 0
        if bool(bad.any()):  # rounding at the very top of the CDF
            pick[bad] = probs[bad].argmax(dim=1)
        out[idx] = pick
        return out

    def _top_k_top_p(self, z: torch.Tensor, top_k: np.ndarray, top_p: np.ndarray) -> torch.Tensor:
        """Set to -inf what top-k / top-p cut (``z`` is edited in place)."""
        vocab, dev = z.shape[1], z.device
        if (top_k > 0).any():
            k = torch.from_numpy(np.where(top_k > 0, np.minimum(top_k, vocab), vocab)).to(dev)
            kmax = int(k.max())
            kth = torch.topk(z, kmax, dim=1).values.gather(1, (k - 1).unsqueeze(1))
            z = z.masked_fill(z < kth, float("-inf"))
        if (top_p < 1).any():
            rows = torch.from_numpy(np.flatnonzero(top_p < 1)).to(dev)
            p = torch.from_numpy(top_p).to(dev, dtype=z.dtype)[rows]
            probs = torch.softmax(z[rows], dim=1)
            cand = min(self.top_p_candidates, vocab)
            vals = torch.topk(probs, cand, dim=1).values
            cum = torch.cumsum(vals, dim=1)
            enough = cum[:, -1] >= p
            if not bool(enough.all()):  # the candidates hold too little mass: sort fully
                vals_full = torch.sort(probs[~enough], dim=1, descending=True).values
                cum_full = torch.cumsum(vals_full, dim=1)
            # smallest set of highest probabilities whose mass reaches p
            cut_at = torch.searchsorted(cum, p.unsqueeze(1)).clamp_(max=cand - 1)
            threshold = vals.gather(1, cut_at).squeeze(1)
            if not bool(enough.all()):
                cut_full = torch.searchsorted(cum_full, p[~enough].unsqueeze(1)).clamp_(max=vocab - 1)
                threshold[~enough] = vals_full.gather(1, cut_full).squeeze(1)
            drop = probs < threshold.unsqueeze(1)
            z[rows] = z[rows].masked_fill(drop, float("-inf"))
        return z

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
        order = np.lexsort((-z, seg))
        seg, tok, z = seg[order], tok[order], z[order]
        counts = np.bincount(seg, minlength=m)
        present = counts > 0
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        first = starts[seg]
        rank = np.arange(len(seg)) - first
        # greedy rows: the best allowed token
        best = tok[starts[present]]
        result[present] = best
        rnd = present & ~greedy
        if not rnd.any():
            return result
        zmax = z[first]
        e = np.exp(z - zmax)
        e[~np.isfinite(z)] = 0.0
        k = batch.top_k[rows][seg]
        e[(k > 0) & (rank >= k)] = 0.0
        p = batch.top_p[rows].astype(np.float64)[seg]
        if (p < 1).any():
            g = np.cumsum(e)
            seg_cum = g - (g[first] - e[first])
            total = np.add.reduceat(e, starts[present])
            tot = np.zeros(m)
            tot[present] = total
            keep = (seg_cum - e) < p * tot[seg]
            e[~keep] = 0.0
        g = np.cumsum(e)
        base = g[starts[rnd]] - e[starts[rnd]]
        ends = starts[rnd] + counts[rnd]
        total = g[ends - 1] - base
        target = base + batch.uniforms[rows[rnd]] * total
        pick = np.searchsorted(g, target, side="right")
        pick = np.minimum(pick, ends - 1)
        # never land on a zero-weight id (cut by top-k/top-p, or rounding)
        bad = e[pick] <= 0
        if bad.any():
            pick[bad] = starts[rnd][bad]
        result[rnd] = tok[pick]
        return result

    # ----- CUDA and other devices ---------------------------------------------

    def _sample_device(self, logits: torch.Tensor, batch: SamplingBatch, cons: StepConstraints) -> np.ndarray:
        dev = logits.device
        if cons.mask is not None and len(cons.mask.rows):
            rows = cons.mask.rows
            hi = int(rows.max()) + 1
            mask_dev = cons.mask.buffer[:hi].to(dev, non_blocking=True)
            apply_bitmask_inplace(logits, mask_dev, rows)
        if len(cons.ban_rows):
            r = torch.from_numpy(cons.ban_rows).to(dev)
            i = torch.from_numpy(cons.ban_ids).to(dev)
            saved = logits[r, i].clone()
            logits[r, i] = float("-inf")
            dead = torch.isinf(logits[r]).all(dim=1)
            if bool(dead.any()):
                logits[r[dead], i[dead]] = saved[dead]
        rows_all = np.arange(logits.shape[0])
        temp = torch.from_numpy(batch.temperature).to(dev)
        greedy = temp <= 0
        out = logits.argmax(dim=1)
        if not bool(greedy.all()):
            z = logits / torch.where(greedy, torch.ones_like(temp), temp).unsqueeze(1)
            z = self._top_k_top_p(z, batch.top_k[rows_all], batch.top_p[rows_all])
            probs = torch.softmax(z.float(), dim=1)
            cdf = torch.cumsum(probs, dim=1)
            u = torch.from_numpy(batch.uniforms).to(dev, dtype=cdf.dtype)
            pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
            pick = pick.clamp_(max=logits.shape[1] - 1)
            out = torch.where(greedy, out, pick)
        return out.cpu().numpy().astype(np.int64)
