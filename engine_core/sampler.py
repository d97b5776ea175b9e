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

from structured_output.apply import allowed_counts, allowed_ids, apply_bitmask_inplace
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

    def __init__(
        self, vocab_rows: int, *, max_sparse_ids: int | None = None, top_p_candidates: int = 1024
    ):
        self.vocab_rows = vocab_rows
        #: a mask row that allows at most this many ids is sampled from them alone
        #: (default: a sixteenth of the vocabulary); the others are masked in place
        #: and go through the full-vocabulary pass
        self.max_sparse_ids = vocab_rows // 16 if max_sparse_ids is None else max_sparse_ids
        self.top_p_candidates = top_p_candidates

    def sample(
        self, logits: torch.Tensor, batch: SamplingBatch, cons: StepConstraints
    ) -> np.ndarray:
        """One token per row of ``logits`` ``[n, vocab_rows]`` (edited in place)."""
        n = logits.shape[0]
        tokens = np.empty(n, dtype=np.int64)
        full = np.ones(n, dtype=bool)
        masked = np.zeros(n, dtype=bool)
        if cons.mask is not None and len(cons.mask.rows):
            rows = cons.mask.rows
            if logits.device.type == "cpu":
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
                apply_bitmask_inplace(logits, cons.mask.buffer, rows[~small])
                masked[rows[~small]] = True
            else:
                hi = int(rows.max()) + 1
                mask_dev = cons.mask.buffer[:hi].to(logits.device, non_blocking=True)
                apply_bitmask_inplace(logits, mask_dev, rows)
                masked[rows] = True
        full_rows = np.flatnonzero(full)
        if len(full_rows):
            self._ban(logits, cons, full, masked)
            tokens[full_rows] = self._sample_full(logits, full_rows, batch)
        if len(cons.forced_rows):
            tokens[cons.forced_rows] = cons.forced_ids
        return tokens

    def _ban(
        self, logits: torch.Tensor, cons: StepConstraints, full: np.ndarray, masked: np.ndarray
    ) -> None:
        """Forbid the (row, id) bans of full-vocabulary rows, except in a row where
        they would forbid everything (only a masked row can come to that)."""
        if not len(cons.ban_rows):
            return
        sel = full[cons.ban_rows]
        if not sel.any():
            return
        rows, ids = cons.ban_rows[sel], cons.ban_ids[sel]
        if logits.device.type == "cpu":
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
        self, logits: torch.Tensor, rows: np.ndarray, batch: SamplingBatch
    ) -> np.ndarray:
        """Sample rows ``rows`` of ``logits`` over the whole vocabulary (masked ids are
        -inf already). Rows are edited in place. On a CPU the passes run in numpy,
        several times faster here than torch's reductions over such wide rows."""
        n = logits.shape[0]
        dev = logits.device
        cpu = dev.type == "cpu"
        arr = logits.numpy() if cpu else logits
        temp = batch.temperature[rows]
        out = np.empty(len(rows), dtype=np.int64)
        greedy = temp <= 0
        if greedy.any():
            g = rows[greedy]
            if cpu:
                out[greedy] = (arr if len(g) == n else arr[g]).argmax(axis=1)
            else:
                z = logits if len(g) == n else logits[torch.from_numpy(g).to(dev)]
                out[greedy] = z.argmax(dim=1).cpu().numpy()
        rnd = np.flatnonzero(~greedy)
        if not len(rnd):
            return out
        r = rows[rnd]
        cut = (batch.top_k[r] > 0) | (batch.top_p[r] < 1)
        trimmed = r[cut]
        if len(trimmed):  # top-k / top-p rows: on a copy, before the in-place pass
            z = logits[torch.from_numpy(trimmed).to(dev)]
            z /= torch.from_numpy(temp[rnd[cut]]).to(dev, z.dtype).unsqueeze(1)
            z = self._top_k_top_p(z, batch.top_k[trimmed], batch.top_p[trimmed])
            out[rnd[cut]] = (
                _inverse_cdf_np(z.numpy(), None, batch.uniforms[trimmed])
                if cpu
                else _inverse_cdf(z, None, batch.uniforms[trimmed])
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
            z_all = arr
            drawn = (
                _inverse_cdf_np(z_all, inv_all, u_all)
                if cpu
                else _inverse_cdf(z_all, inv_all, u_all)
            )
            out[rnd[~cut]] = drawn[plain]
        elif cpu:
            out[rnd[~cut]] = _inverse_cdf_np_rows(arr, plain, inv_t, u)
        else:
            out[rnd[~cut]] = _inverse_cdf(logits[torch.from_numpy(plain).to(dev)], inv_t, u)
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
                cut_full = torch.searchsorted(cum_full, p[~enough].unsqueeze(1)).clamp_(
                    max=vocab - 1
                )
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


def _block_size(vocab: int) -> int:
    for bs in (128, 64, 32, 16, 8, 4, 2):
        if vocab % bs == 0:
            return bs
    return 1


def _inverse_cdf(z: torch.Tensor, inv_t: np.ndarray | None, u: np.ndarray) -> np.ndarray:
    """One draw per row of ``softmax(z * inv_t)`` by inverse CDF, in two levels: pick a
    block of ids by the blocks' masses, then an id inside it. Three passes over the
    logits (max, exp, block sums) instead of softmax and a full cumulative sum.
    ``z`` is overwritten; ``-inf`` entries are never drawn; a row with nothing
    allowed gives -1."""
    k, vocab = z.shape
    dev = z.device
    bs = _block_size(vocab)
    mx = z.max(dim=1, keepdim=True).values
    dead = torch.isinf(mx).squeeze(1)
    mx[dead] = 0.0
    z.sub_(mx)
    if inv_t is not None and not np.all(inv_t == 1.0):
        z.mul_(torch.from_numpy(inv_t.astype(np.float32)).to(dev).unsqueeze(1))
    z.exp_()
    blocks = z.view(k, -1, bs)
    mass = blocks.sum(dim=2)
    cum = torch.cumsum(mass, dim=1)
    target = torch.from_numpy(u).to(dev, cum.dtype) * cum[:, -1]
    b = torch.searchsorted(cum, target.unsqueeze(1), right=True).squeeze(1)
    b.clamp_(max=cum.shape[1] - 1)
    arange = torch.arange(k, device=dev)
    # rounding at the top of the CDF can land on an empty block: take the last
    # block with mass instead
    empty = mass[arange, b] <= 0
    if bool(empty.any()):
        last = (mass > 0).float().cumsum(dim=1).argmax(dim=1)
        b = torch.where(empty, last, b)
    before = torch.where(b > 0, cum[arange, (b - 1).clamp(min=0)], torch.zeros_like(target))
    inner = blocks[arange, b]
    icum = torch.cumsum(inner, dim=1)
    j = torch.searchsorted(icum, (target - before).clamp(min=0).unsqueeze(1), right=True).squeeze(1)
    j.clamp_(max=bs - 1)
    zero = inner[arange, j] <= 0
    if bool(zero.any()):
        j = torch.where(zero, (inner > 0).float().cumsum(dim=1).argmax(dim=1), j)
    tok = b * bs + j
    tok[dead] = -1
    return tok.cpu().numpy()


def _inverse_cdf_np_rows(
    x: np.ndarray, rows: np.ndarray, inv_t: np.ndarray, u: np.ndarray
) -> np.ndarray:
    """`_inverse_cdf_np` over rows ``rows`` (ascending) of ``x``, in place: one call per
    run of consecutive rows, on a view, so nothing is copied."""
    out = np.empty(len(rows), dtype=np.int64)
    cuts = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate(([0], cuts)).tolist()
    ends = np.concatenate((cuts, [len(rows)])).tolist()
    for a, b in zip(starts, ends, strict=True):
        r = int(rows[a])
        out[a:b] = _inverse_cdf_np(x[r : r + b - a], inv_t[a:b], u[a:b])
    return out


def _inverse_cdf_np(z: np.ndarray, inv_t: np.ndarray | None, u: np.ndarray) -> np.ndarray:
    """`_inverse_cdf` in numpy, for a CPU (``z`` float32 ``[k, vocab]``, overwritten)."""
    k, vocab = z.shape
    bs = _block_size(vocab)
    mx = z.max(axis=1, keepdims=True)
    dead = ~np.isfinite(mx[:, 0])
    mx[dead] = 0.0
    z -= mx
    if inv_t is not None and not np.all(inv_t == 1.0):
        z *= inv_t.astype(np.float32)[:, None]
    np.exp(z, out=z)
    blocks = z.reshape(k, -1, bs)
    mass = blocks.sum(axis=2).astype(np.float64)
    cum = np.cumsum(mass, axis=1)
    target = u * cum[:, -1]
    b = np.minimum((cum <= target[:, None]).sum(axis=1), cum.shape[1] - 1)
    arange = np.arange(k)
    empty = mass[arange, b] <= 0  # rounding at the top of the CDF
    if empty.any():
        last = mass.shape[1] - 1 - np.argmax(mass[:, ::-1] > 0, axis=1)
        b = np.where(empty, last, b)
    before = np.where(b > 0, cum[arange, np.maximum(b - 1, 0)], 0.0)
    inner = blocks[arange, b].astype(np.float64)
    icum = np.cumsum(inner, axis=1)
    j = np.minimum((icum <= (target - before)[:, None]).sum(axis=1), bs - 1)
    zero = inner[arange, j] <= 0
    if zero.any():
        j = np.where(zero, bs - 1 - np.argmax(inner[:, ::-1] > 0, axis=1), j)
    tok = b * bs + j
    tok[dead] = -1
    return tok.astype(np.int64)
