"""The sampler: every kernel (numpy with and without its sparse path, torch) runs here
on CPU tensors and must draw what full-vocabulary masking and sampling would, with
top-k and top-p as one definition (`sampling_math.draw_sorted`) checked against a
row-by-row oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_core.sampler import Sampler, SamplingBatch, StepConstraints
from engine_core.sampling_math import (
    TopPScratch,
    draw_sorted,
    inverse_cdf_np,
    inverse_cdf_np_rows,
    inverse_cdf_torch,
    top_p_candidates_np,
    weights_np,
)
from structured_output.bitmask import FilledMask, bitmask_words

V = 5000

#: (kernel, max_sparse_ids, device): numpy with small rows sampled from their ids
#: alone, numpy with every row masked in place, torch (the kernel of a GPU) on CPU
#: tensors, and on CUDA where there is one
_ALL = {
    "numpy-sparse": ("numpy", 1000, "cpu"),
    "numpy-dense": ("numpy", 0, "cpu"),
    "torch": ("torch", 1000, "cpu"),
    "torch-cuda": ("torch", 1000, "cuda"),
}
_NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA here")
PATHS = [pytest.param(p, marks=_NO_CUDA) if p.endswith("cuda") else p for p in _ALL]


class _OnDevice:
    """A sampler fed its logits on the path's device (the tests build them on the CPU)."""

    def __init__(self, sampler: Sampler, device: str) -> None:
        self.sampler, self.device = sampler, torch.device(device)

    def sample(self, logits: torch.Tensor, batch: SamplingBatch, cons: StepConstraints):
        return self.sampler.sample(logits.to(self.device), batch, cons)


def _sampler(path: str, **kw) -> _OnDevice:
    kernel, max_sparse, device = _ALL[path]
    return _OnDevice(Sampler(V, max_sparse_ids=max_sparse, kernel=kernel, **kw), device)


def _mask(rows: int, allowed: dict[int, np.ndarray]) -> FilledMask:
    buf = torch.zeros((rows, bitmask_words(V)), dtype=torch.int32)
    view = buf.numpy().view(np.uint32)
    for r, ids in allowed.items():
        np.bitwise_or.at(
            view[r], ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32))
        )
    return FilledMask(buf, np.asarray(sorted(allowed), dtype=np.int64))


def _batch(n, *, temp=1.0, top_p=1.0, top_k=0, seed=0):
    rng = np.random.default_rng(seed)
    return SamplingBatch(
        np.full(n, temp, np.float32),
        np.full(n, top_p, np.float32),
        np.full(n, top_k, np.int64),
        rng.random(n),
    )


@pytest.fixture()
def setup():
    rng = np.random.default_rng(1)
    logits = torch.from_numpy(rng.standard_normal((6, V)).astype(np.float32) * 2)
    allowed = {
        0: rng.choice(V, 7, replace=False),
        1: rng.choice(V, 40, replace=False),
        2: np.arange(V)[np.arange(V) % 3 != 0],  # dense
        3: np.array([V - 1]),
    }
    return logits, allowed


@pytest.mark.parametrize("path", PATHS)
def test_greedy_is_the_best_allowed_token(setup, path):
    logits, allowed = setup
    s = _sampler(path)
    tok = s.sample(logits.clone(), _batch(6, temp=0.0), StepConstraints(mask=_mask(6, allowed)))
    x = logits.numpy()
    for r, ids in allowed.items():
        assert tok[r] == ids[np.argmax(x[r, ids])]
    assert tok[4] == np.argmax(x[4]) and tok[5] == np.argmax(x[5])


def _many(logits, row, allowed_ids, n, sampler, **kw):
    """``n`` draws of one row, in one batch of ``n`` copies with distinct uniforms."""
    x = logits[row : row + 1].repeat(n, 1)
    b = _batch(n, seed=11, **kw)
    mask = None if allowed_ids is None else _mask(n, {i: allowed_ids for i in range(n)})
    return sampler.sample(x, b, StepConstraints(mask=mask))


def _expected(logits, row, ids, *, temp=1.0, top_k=0, top_p=1.0):
    """The oracle: softmax over the allowed ids, sorted, top-k, then top-p over what
    top-k kept (the smallest prefix whose mass reaches top_p)."""
    x = logits.numpy()[row, ids].astype(np.float64) / temp
    p = np.exp(x - x.max())
    order = np.argsort(-p)
    keep = np.zeros(len(ids), bool)
    keep[order[: top_k or len(ids)]] = True
    q = np.where(keep, p, 0)[order]
    cum = np.cumsum(q / q.sum())
    keep[order[np.searchsorted(cum, np.float32(top_p)) + 1 :]] = False
    p = np.where(keep, p, 0)
    return dict(zip(ids.tolist(), p / p.sum(), strict=True))


SETTINGS = [
    {},
    {"top_k": 5},
    {"top_p": 0.6},
    {"temp": 0.5, "top_p": 0.9, "top_k": 20},
    {"temp": 1.7, "top_p": 0.3},
]


@pytest.mark.parametrize("kw", SETTINGS)
@pytest.mark.parametrize("path", PATHS)
def test_draws_follow_the_softmax_over_allowed_ids(setup, kw, path):
    """Every path (sparse: allowed ids only; dense: full-vocabulary masking; torch)
    draws from the softmax over the allowed ids, with top-k and top-p applied."""
    logits, allowed = setup
    ids = allowed[1]
    n = 4000
    tok = _many(logits, 1, ids, n, _sampler(path), **kw)
    expected = _expected(logits, 1, ids, **kw)
    assert set(tok.tolist()) <= {i for i, p in expected.items() if p > 0}
    for i, p in expected.items():
        assert abs((tok == i).mean() - p) < 0.03, (i, p)


@pytest.mark.parametrize("kw", [{"top_p": 0.5}, {"top_p": 0.95, "temp": 2.0}, {"top_k": 3}])
@pytest.mark.parametrize("path", [p for p in PATHS if p != "numpy-sparse"])
def test_unconstrained_rows_with_a_flat_distribution(path, kw):
    """A flat row (top-p keeps thousands of ids): the torch kernel's candidates must
    grow past ``top_p_candidates`` (8 here), and the numpy kernel's histogram must
    find them; both draw what the oracle says."""
    rng = np.random.default_rng(7)
    logits = torch.from_numpy(rng.standard_normal((1, V)).astype(np.float32) * 0.3)
    ids = np.arange(V)
    n = 3000
    tok = _many(logits, 0, None, n, _sampler(path, top_p_candidates=8), **kw)
    expected = _expected(logits, 0, ids, **kw)
    allowed = np.array([expected[i] > 0 for i in range(V)])
    assert allowed[tok].all()
    # too many ids for per-id frequencies: compare the distribution of ranks instead
    rank = np.empty(V, np.int64)
    rank[np.argsort(-logits.numpy()[0])] = np.arange(V)
    p_sorted = np.array([expected[i] for i in np.argsort(-logits.numpy()[0])])
    cdf = np.cumsum(p_sorted)
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        want = int(np.searchsorted(cdf, q))
        got = float(np.quantile(rank[tok], q))
        assert abs(got - want) <= max(0.05 * allowed.sum(), 2), (q, got, want)


@pytest.mark.parametrize("path", PATHS)
def test_top_k_one_and_tiny_top_p_are_greedy(setup, path):
    logits, allowed = setup
    s = _sampler(path)
    g = s.sample(logits.clone(), _batch(6, temp=0.0), StepConstraints(mask=_mask(6, allowed)))
    for kw in ({"top_k": 1}, {"top_p": 1e-6}):
        assert (
            s.sample(
                logits.clone(), _batch(6, seed=9, **kw), StepConstraints(mask=_mask(6, allowed))
            )
            == g
        ).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kw", [{"temp": 0.0}, {}, {"top_k": 3}, {"top_p": 0.5}])
def test_bans_forced_tokens_and_an_all_banned_row(setup, path, kw):
    logits, allowed = setup
    s = _sampler(path)
    g = s.sample(logits.clone(), _batch(6, temp=0.0), StepConstraints(mask=_mask(6, allowed)))
    cons = StepConstraints(
        mask=_mask(6, allowed),
        ban_rows=np.array([0, 4, 3]),
        ban_ids=np.array([g[0], g[4], V - 1]),
        forced_rows=np.array([5]),
        forced_ids=np.array([17]),
    )
    for seed in range(5):
        t = s.sample(logits.clone(), _batch(6, seed=seed, **kw), cons)
        assert t[0] != g[0] and t[0] in allowed[0]
        assert t[4] != g[4]
        assert t[3] == V - 1  # its only allowed id was banned: the ban is lifted
        assert t[5] == 17


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kw", [{}, {"temp": 0.0}, {"top_k": 4}, {"top_p": 0.7}])
def test_a_row_that_allows_nothing_gives_minus_one(path, kw):
    s = _sampler(path)
    buf = torch.zeros((2, bitmask_words(V)), dtype=torch.int32)
    buf[1] = -1  # row 1 allows everything
    t = s.sample(
        torch.zeros((2, V)), _batch(2, **kw), StepConstraints(mask=FilledMask(buf, np.array([0])))
    )
    assert t[0] == -1 and 0 <= t[1] < V


def test_rows_in_place_draw_what_a_copy_draws():
    """The pass over some rows runs in place, run by run: the same draws as the pass
    over a gathered copy, and the other rows untouched."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, V)).astype(np.float32)
    x[5, ::2] = -np.inf
    x[9] = -np.inf  # a row with nothing allowed
    for rows in (np.array([0]), np.array([3, 4, 5, 9, 20, 21, 39]), np.arange(0, 40, 3)):
        inv_t, u = rng.uniform(0.5, 2.0, len(rows)), rng.random(len(rows))
        expected = inverse_cdf_np(x[rows].copy(), inv_t, u)
        work = x.copy()
        got = inverse_cdf_np_rows(work, rows, inv_t, u)
        assert (got == expected).all()
        others = np.setdiff1d(np.arange(40), rows)
        assert np.array_equal(work[others], x[others])


def test_the_two_inverse_cdf_kernels_agree():
    """numpy and torch turn the same uniforms into the same tokens (float rounding may
    move a draw that falls right on a boundary: at most a few in a thousand)."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((400, V)).astype(np.float32) * 2
    x[7, :] = -np.inf
    x[8, ::3] = -np.inf
    inv_t, u = rng.uniform(0.3, 2.0, 400), rng.random(400)
    a = inverse_cdf_np(x.copy(), inv_t, u)
    b = inverse_cdf_torch(torch.from_numpy(x.copy()), inv_t, u)
    assert a[7] == b[7] == -1
    assert np.isfinite(x[8, a[8]]) and np.isfinite(x[8, b[8]])
    assert (a == b).mean() >= 0.995, (a != b).sum()


@pytest.mark.parametrize("path", PATHS)
def test_a_mixed_batch_draws_each_row_as_alone(path):
    """Sparse, dense, greedy, top-k, top-p and unconstrained rows interleaved in one
    batch: each row draws what it draws in a batch of its own with the same uniform."""
    rng = np.random.default_rng(4)
    n = 15
    logits = torch.from_numpy(rng.standard_normal((n, V)).astype(np.float32))
    allowed = {r: rng.choice(V, 30, replace=False) for r in range(0, n, 3)}
    allowed |= {r: np.flatnonzero(rng.random(V) < 0.7) for r in range(1, n, 3)}
    batch = _batch(n, seed=5)
    batch.temperature[[2, 7]] = 0.0
    batch.temperature[[4, 5]] = 0.7
    batch.top_k[[3, 6, 10, 12]] = [20, 5, 20, 7]
    batch.top_p[[6, 8, 9, 11, 13]] = [0.8, 0.5, 0.9, 0.3, 0.8]
    s = _sampler(path)
    together = s.sample(logits.clone(), batch, StepConstraints(mask=_mask(n, allowed)))
    for r in range(n):
        one = SamplingBatch(
            batch.temperature[r : r + 1],
            batch.top_p[r : r + 1],
            batch.top_k[r : r + 1],
            batch.uniforms[r : r + 1],
        )
        mask = _mask(1, {0: allowed[r]}) if r in allowed else None
        alone = s.sample(logits[r : r + 1].clone(), one, StepConstraints(mask=mask))
        assert together[r] == alone[0], r
        if r in allowed:
            assert together[r] in set(allowed[r].tolist())


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="unknown sampler kernel"):
        Sampler(V, kernel="cupy")


# ----- the one definition of top-k and top-p, against a row-by-row oracle ------------


def _oracle(w: np.ndarray, k: int, p: float, u: float, mass: float | None) -> int:
    """One sorted segment, the plain way: top-k, then top-p over the mass kept (or the
    row's whole mass), then inverse CDF; -1 when nothing has weight."""
    kept = w[: k if 0 < k < len(w) else len(w)]
    m = kept.sum() if (k > 0 or mass is None) else mass
    n = 0
    before = 0.0
    while n < len(kept) and before < p * m:
        before += kept[n]
        n += 1
    kept = kept[:n]
    total = kept.sum()
    if total <= 0:
        return -1
    c = np.cumsum(kept)
    i = int(np.searchsorted(c, u * total, side="right"))
    i = min(i, n - 1)
    while kept[i] <= 0:
        i -= 1
    return i


@pytest.mark.parametrize("seed", range(6))
def test_draw_sorted_matches_the_oracle(seed):
    rng = np.random.default_rng(seed)
    m = 60
    counts = rng.integers(0, 40, m)
    counts[:3] = [0, 1, 39]
    parts = []
    for c in counts:
        w = np.sort(rng.exponential(size=c) ** rng.uniform(0.5, 4))[::-1]
        w[rng.random(c) < 0.1] = 0.0  # zero weights (masked, banned, underflowed)
        w = np.sort(w)[::-1]
        if c > 4 and rng.random() < 0.3:
            w[1:4] = w[1]  # ties
        parts.append(w)
    flat = np.concatenate(parts)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    top_k = np.where(rng.random(m) < 0.5, rng.integers(1, 50, m), 0)
    top_p = np.where(rng.random(m) < 0.5, rng.uniform(0.01, 1.0, m), 1.0)
    u = rng.random(m)
    u[:5] = [0.0, 0.999999999, 0.5, 0.0, 1 - 1e-12]
    pos, short = draw_sorted(flat, starts, counts, top_k, top_p, u)
    assert not short.any()
    for i in range(m):
        want = _oracle(parts[i], int(top_k[i]), float(top_p[i]), float(u[i]), None)
        got = -1 if pos[i] < 0 else int(pos[i] - starts[i])
        assert got == want, (i, counts[i], top_k[i], top_p[i], u[i])
    # candidates that are only a row's heaviest part: top-p against the row's mass
    mass = np.array([w.sum() for w in parts]) * rng.uniform(1.0, 3.0, m)
    no_k = np.zeros(m, np.int64)
    pos, short = draw_sorted(flat, starts, counts, no_k, top_p, u, mass)
    for i in range(m):
        whole = parts[i].sum()
        assert short[i] == (whole < top_p[i] * mass[i])
        if not short[i]:
            want = _oracle(parts[i], 0, float(top_p[i]), float(u[i]), float(mass[i]))
            assert (-1 if pos[i] < 0 else int(pos[i] - starts[i])) == want


@pytest.mark.parametrize("scale", [0.05, 1.0, 3.0, 12.0])
@pytest.mark.parametrize("top_p", [0.01, 0.5, 0.9, 0.999])
def test_top_p_candidates_hold_every_id_top_p_keeps(scale, top_p):
    """The histogram's candidates, from a flat row to a peaked one: every id that
    top-p keeps is among them, heaviest first; nothing lighter than the lightest kept
    id is missing before it."""
    rng = np.random.default_rng(int(scale * 100) + int(top_p * 1000))
    x = (rng.standard_normal((1, V)) * scale).astype(np.float32)
    x[0, rng.random(V) < 0.2] = -np.inf
    mass = weights_np(x, np.array([0]), np.ones(1))
    w, ids = top_p_candidates_np(x, 0, float(mass[0]), top_p, TopPScratch(V))
    full = np.sort(x[0].astype(np.float64))[::-1]
    kept = _oracle(full, 0, top_p, 1.0 - 1e-15, float(mass[0])) + 1
    assert len(w) >= kept
    assert np.array_equal(w, full[: len(w)])  # the heaviest, in order
    assert np.array_equal(x[0, ids], w.astype(np.float32))
    tied = np.flatnonzero(w[:-1] == w[1:])
    assert (ids[tied] < ids[tied + 1]).all()  # equal weights in id order


def test_many_rows_masked_in_place_on_two_threads_equal_one_by_one():
    """From `sampler._SPLIT_ROWS` rows a helper thread masks half of them: every row
    ends as xgrammar's kernel leaves it alone, and greedy draws keep to the masks."""
    import threading

    from engine_core import sampler as sampler_module
    from structured_output.apply import apply_bitmask_inplace

    n = 2 * sampler_module._SPLIT_ROWS + 3
    rng = np.random.default_rng(11)
    allowed = {r: np.flatnonzero(rng.random(V) < 0.5) for r in range(n)}
    mask = _mask(n, allowed)
    logits = torch.from_numpy(rng.standard_normal((n, V)).astype(np.float32))
    want = logits.clone()
    for r in range(n):
        apply_bitmask_inplace(want, mask.buffer, np.array([r]))
    sampler = Sampler(V, max_sparse_ids=0, kernel="numpy")  # every row masked in place
    try:
        got = logits.clone()
        sampler.mask_in_place(got, mask.buffer, np.arange(n))
        assert torch.equal(got, want)
        assert any(t.name.startswith("thinkgate-mask") for t in threading.enumerate())
        batch = SamplingBatch(
            temperature=np.zeros(n, np.float32),
            top_p=np.ones(n, np.float32),
            top_k=np.zeros(n, np.int64),
            uniforms=rng.random(n),
        )
        tokens = sampler.sample(logits.clone(), batch, StepConstraints(mask=mask))
        best = want.argmax(dim=1).numpy()
        np.testing.assert_array_equal(tokens, best)
        assert all(t in allowed[r] for r, t in enumerate(tokens.tolist()))
    finally:
        sampler.close()


def test_many_rows_drawn_on_two_threads_draw_what_one_call_draws():
    """From `sampler._SPLIT_ROWS` rows a helper thread draws half of the rows sampled
    from the whole vocabulary: the tokens of one `inverse_cdf_np` over every row,
    a row with nothing allowed included; and through `Sampler.sample`, each row
    draws what it draws alone."""
    import threading

    from engine_core import sampler as sampler_module

    n = 2 * sampler_module._SPLIT_ROWS + 3
    rng = np.random.default_rng(21)
    x = rng.standard_normal((n, V)).astype(np.float32)
    x[4] = -np.inf
    x[n - 1, ::2] = -np.inf
    inv_t, u = rng.uniform(0.5, 2.0, n), rng.random(n)
    want = inverse_cdf_np(x.copy(), inv_t, u)
    sampler = Sampler(V, kernel="numpy")
    try:
        got = sampler.draw_all_np(x.copy(), inv_t, u)
        np.testing.assert_array_equal(got, want)
        assert got[4] == -1
        assert any(t.name.startswith("thinkgate-mask") for t in threading.enumerate())
        batch = _batch(n, seed=8)
        tokens = sampler.sample(torch.from_numpy(x.copy()), batch, StepConstraints())
        for r in (0, 4, n // 2, n - 1):
            one = SamplingBatch(
                batch.temperature[r : r + 1],
                batch.top_p[r : r + 1],
                batch.top_k[r : r + 1],
                batch.uniforms[r : r + 1],
            )
            alone = sampler.sample(torch.from_numpy(x[r : r + 1].copy()), one, StepConstraints())
            assert tokens[r] == alone[0], r
    finally:
        sampler.close()
