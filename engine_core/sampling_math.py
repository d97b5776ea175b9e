"""The sampler's arithmetic: one definition of top-k and top-p, and the inverse-CDF
draws over whole rows (numpy for a CPU, torch for any device).

Top-k and top-p are defined once, in `draw_sorted`, on candidates sorted by weight:
the sparse path hands it a row's allowed ids, the dense path a row's partial top-k.
Every draw turns one uniform number per row into a token, so the same seed gives the
same token whatever else is in the batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch


def draw_sorted(
    w: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    u: np.ndarray,
    row_mass: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw one element per segment of ``w`` after top-k and top-p.

    ``w``: float64 weights (unnormalized probabilities, >= 0), each segment
    ``w[starts[i] : starts[i] + counts[i]]`` sorted from heaviest to lightest. Per
    segment: top-k (``top_k[i] > 0``) keeps its ``top_k[i]`` heaviest elements; top-p
    then keeps the shortest prefix of those whose mass reaches ``top_p[i]`` of the
    mass ``M`` they share (``M``: the top-k elements' mass; without top-k, the whole
    row's mass, which is ``row_mass[i]`` when the segment holds only a row's heaviest
    candidates, else the segment's own). The draw is by inverse CDF at ``u[i]`` over
    what is kept; zero weights are never drawn.

    Returns ``(position, short)``: the position in ``w`` drawn for each segment (-1
    where nothing has weight), and whether top-p needs more of the row than the
    segment holds (only with ``row_mass``; such a segment's draw is not valid).
    """
    cum = np.zeros(len(w) + 1)
    np.cumsum(w, out=cum[1:])
    base = cum[starts]
    end = starts + counts
    kk = np.where((top_k > 0) & (top_k < counts), top_k, counts)
    mass_k = cum[starts + kk] - base
    whole = cum[end] - base
    if row_mass is None:
        m = mass_k
        short = np.zeros(len(starts), dtype=bool)
    else:
        m = np.where(top_k > 0, mass_k, row_mass)
        short = (top_k <= 0) & (whole < top_p * m)
    # keep element i while the mass before it is under p*M: n_keep is the first n
    # whose prefix mass cum[start + n] - base reaches p*M
    first = np.searchsorted(cum, base + top_p.astype(np.float64) * m, side="left")
    n_keep = np.minimum(np.clip(first - starts, 1, np.maximum(kk, 1)), counts)
    # without the zero weights at its tail (what rounding at p = 1 can let in)
    n_keep = np.maximum(np.searchsorted(cum, cum[starts + n_keep], side="left") - starts, 0)
    kept = cum[starts + n_keep] - base
    target = base + u * kept
    pos = np.searchsorted(cum, target, side="right") - 1
    pos = np.clip(pos, starts, np.maximum(starts + n_keep - 1, starts))
    pos = np.where(kept > 0, pos, -1)
    return pos, short


def draw_candidates(
    w: np.ndarray,
    ids: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    u: np.ndarray,
    row_mass: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`draw_sorted` over candidate matrices: ``w`` float64 ``[m, K]`` sorted along each
    row from heaviest to lightest, ``ids`` their token ids. Returns ``(tokens, short)``
    (-1: nothing to draw)."""
    m, k = w.shape
    starts = np.arange(m, dtype=np.int64) * k
    counts = np.full(m, k, dtype=np.int64)
    pos, short = draw_sorted(w.reshape(-1), starts, counts, top_k, top_p, u, row_mass)
    flat = ids.reshape(-1)
    return np.where(pos >= 0, flat[np.maximum(pos, 0)], -1), short


def stable_order(vals: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidates ``[m, K]`` ordered by value (descending), ties by id: a partial
    top-k leaves the order of equal values to its algorithm, and a draw must not
    depend on it."""
    if not len(vals) or not (vals[:, 1:] == vals[:, :-1]).any():
        return vals, ids
    order = np.lexsort((ids, -vals), axis=-1)
    return np.take_along_axis(vals, order, 1), np.take_along_axis(ids, order, 1)


def runs(rows: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """``(i0, i1, r0)`` per run of consecutive values of ascending ``rows``:
    ``rows[i0:i1] == r0 + arange(i1 - i0)``."""
    if not len(rows):
        return
    cuts = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), len(rows)]
    for a, b in zip(starts, ends, strict=True):
        yield a, b, int(rows[a])


def topk_rows(
    src: torch.Tensor, rows: np.ndarray, k: int, *, in_place: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest values of rows ``rows`` (ascending) of ``src`` and their ids,
    as float64 / int64 ``[len(rows), k]`` host arrays in `stable_order`. ``in_place``:
    read each run of consecutive rows through a view (no gathered copy of the rows)."""
    m = len(rows)
    if in_place:
        vals = torch.empty((m, k), dtype=src.dtype, device=src.device)
        ids = torch.empty((m, k), dtype=torch.int64, device=src.device)
        for a, b, r in runs(rows):
            torch.topk(src[r : r + b - a], k, dim=1, out=(vals[a:b], ids[a:b]))
    else:
        idx = torch.from_numpy(rows).to(src.device)
        vals, ids = torch.topk(src.index_select(0, idx), k, dim=1)
    return stable_order(vals.cpu().numpy().astype(np.float64), ids.cpu().numpy())


#: `top_p_candidates_np` bins float32 weights in [0, 1] by their bits above the 19th:
#: 16 bins per power of two (a bin's weights lie within a factor of 1.044)
_BIN_SHIFT = 19
_BINS = (int(np.float32(1.0).view(np.uint32)) >> _BIN_SHIFT) + 1
_BIN_FLOOR = (np.arange(_BINS, dtype=np.uint32) << _BIN_SHIFT).view(np.float32).astype(np.float64)


class TopPScratch:
    """Buffers of `top_p_candidates_np`, one row long, allocated once."""

    def __init__(self, vocab: int) -> None:
        self.bins = np.empty(vocab, dtype=np.uint32)
        self.keys = np.empty(vocab, dtype=np.intp)


def top_p_candidates_np(
    x: np.ndarray, row: int, mass: float, top_p: float, scratch: TopPScratch
) -> tuple[np.ndarray, np.ndarray]:
    """The ids of row ``row`` of ``x`` (weights, as `weights_np` leaves them) that top-p
    can keep, and their weights, heaviest first (ties by id): every id at least as
    heavy as the lightest one it keeps. Without sorting the row: a histogram of the
    weights by magnitude (counts per bin, times the bin's floor, bound each bin's mass
    from below) finds a weight below which the kept mass cannot reach; a few passes
    over the row, whatever its entropy."""
    v = x[row]
    np.right_shift(v.view(np.uint32), _BIN_SHIFT, out=scratch.bins)
    np.copyto(scratch.keys, scratch.bins)
    counts = np.bincount(scratch.keys, minlength=_BINS)
    below = np.cumsum((counts * _BIN_FLOOR)[::-1])  # mass of the heaviest bins, at least
    j = int(np.searchsorted(below, top_p * mass, side="left"))
    floor = _BIN_FLOOR[max(_BINS - 1 - j, 0)]
    ids = np.flatnonzero(v >= floor)
    w = v[ids].astype(np.float64)
    order = np.argsort(-w, kind="stable")  # ids ascend, so ties stay by id
    return w[order], ids[order]


def weights_np(x: np.ndarray, rows: np.ndarray, inv_t: np.ndarray) -> np.ndarray:
    """Turn rows ``rows`` (ascending) of ``x`` float32 ``[n, V]`` into their weights
    ``exp((x - max) * inv_t)`` in place, run by run; returns each row's mass (float64)."""
    mass = np.empty(len(rows))
    for a, b, r in runs(rows):
        v = x[r : r + b - a]
        mx = v.max(axis=1, keepdims=True)
        mx[~np.isfinite(mx)] = 0.0  # a row with nothing allowed stays all zero weights
        v -= mx
        v *= inv_t[a:b, None].astype(np.float32)
        np.exp(v, out=v)
        mass[a:b] = v.sum(axis=1, dtype=np.float64)
    return mass


def weights_torch(z: torch.Tensor, inv_t: np.ndarray) -> np.ndarray:
    """`weights_np` for a whole tensor ``z`` ``[m, V]`` (any device), in place."""
    mx = z.max(dim=1, keepdim=True).values
    mx[torch.isinf(mx)] = 0.0
    z.sub_(mx).mul_(torch.from_numpy(inv_t.astype(np.float32)).to(z.device).unsqueeze(1))
    z.exp_()
    return z.sum(dim=1, dtype=torch.float64).cpu().numpy()


def block_size(vocab: int) -> int:
    for bs in (128, 64, 32, 16, 8, 4, 2):
        if vocab % bs == 0:
            return bs
    return 1


def inverse_cdf_torch(z: torch.Tensor, inv_t: np.ndarray | None, u: np.ndarray) -> np.ndarray:
    """One draw per row of ``softmax(z * inv_t)`` by inverse CDF, in two levels: pick a
    block of ids by the blocks' masses, then an id inside it. Three passes over the
    logits (max, exp, block sums) instead of softmax and a full cumulative sum.
    ``z`` is overwritten; ``-inf`` entries are never drawn; a row with nothing
    allowed gives -1. The cumulative sums run in float64, as in `inverse_cdf_np`."""
    k, vocab = z.shape
    dev = z.device
    bs = block_size(vocab)
    mx = z.max(dim=1, keepdim=True).values
    dead = torch.isinf(mx).squeeze(1)
    mx[dead] = 0.0
    z.sub_(mx)
    if inv_t is not None and not np.all(inv_t == 1.0):
        z.mul_(torch.from_numpy(inv_t.astype(np.float32)).to(dev).unsqueeze(1))
    z.exp_()
    blocks = z.view(k, -1, bs)
    mass = blocks.sum(dim=2).to(torch.float64)
    cum = torch.cumsum(mass, dim=1)
    target = torch.from_numpy(u).to(dev, torch.float64) * cum[:, -1]
    b = (cum <= target.unsqueeze(1)).sum(dim=1).clamp_(max=cum.shape[1] - 1)
    arange = torch.arange(k, device=dev)
    # rounding at the top of the CDF can land on an empty block: take the last
    # block with mass instead
    empty = mass[arange, b] <= 0
    if bool(empty.any()):
        last = mass.shape[1] - 1 - (mass.flip(1) > 0).to(torch.int8).argmax(dim=1)
        b = torch.where(empty, last, b)
    before = torch.where(b > 0, cum[arange, (b - 1).clamp(min=0)], torch.zeros_like(target))
    inner = blocks[arange, b].to(torch.float64)
    icum = torch.cumsum(inner, dim=1)
    j = (icum <= (target - before).unsqueeze(1)).sum(dim=1).clamp_(max=bs - 1)
    zero = inner[arange, j] <= 0
    if bool(zero.any()):
        j = torch.where(zero, bs - 1 - (inner.flip(1) > 0).to(torch.int8).argmax(dim=1), j)
    tok = b * bs + j
    tok[dead] = -1
    return tok.cpu().numpy()


def inverse_cdf_np_rows(
    x: np.ndarray, rows: np.ndarray, inv_t: np.ndarray, u: np.ndarray
) -> np.ndarray:
    """`inverse_cdf_np` over rows ``rows`` (ascending) of ``x``, in place: one call per
    run of consecutive rows, on a view, so nothing is copied."""
    out = np.empty(len(rows), dtype=np.int64)
    for a, b, r in runs(rows):
        out[a:b] = inverse_cdf_np(x[r : r + b - a], inv_t[a:b], u[a:b])
    return out


def inverse_cdf_np(z: np.ndarray, inv_t: np.ndarray | None, u: np.ndarray) -> np.ndarray:
    """`inverse_cdf_torch` in numpy, for a CPU (``z`` float32 ``[k, vocab]``,
    overwritten); several times faster there than torch's reductions over such wide
    rows."""
    k, vocab = z.shape
    bs = block_size(vocab)
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
