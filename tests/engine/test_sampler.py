"""The sampler: constrained rows sampled from their allowed ids alone must draw
exactly what full-vocabulary masking and sampling would."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_core.sampler import (
    Sampler,
    SamplingBatch,
    StepConstraints,
    _inverse_cdf_np,
    _inverse_cdf_np_rows,
)
from structured_output.bitmask import FilledMask, bitmask_words

V = 5000


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


@pytest.mark.parametrize("max_sparse_ids", [0, 1000])  # all rows dense / small rows sparse
def test_greedy_is_the_best_allowed_token(setup, max_sparse_ids):
    logits, allowed = setup
    s = Sampler(V, max_sparse_ids=max_sparse_ids)
    tok = s.sample(logits.clone(), _batch(6, temp=0.0), StepConstraints(mask=_mask(6, allowed)))
    x = logits.numpy()
    for r, ids in allowed.items():
        assert tok[r] == ids[np.argmax(x[r, ids])]
    assert tok[4] == np.argmax(x[4]) and tok[5] == np.argmax(x[5])


def _many(logits, row, allowed_ids, n, sampler, **kw):
    """``n`` draws of one row, in one batch of ``n`` copies with distinct uniforms."""
    x = logits[row : row + 1].repeat(n, 1)
    b = _batch(n, seed=11, **kw)
    return sampler.sample(x, b, StepConstraints(mask=_mask(n, {i: allowed_ids for i in range(n)})))


def _expected(logits, row, ids, *, temp=1.0, top_k=0, top_p=1.0):
    x = logits.numpy()[row, ids].astype(np.float64) / temp
    p = np.exp(x - x.max())
    order = np.argsort(-p)
    keep = np.zeros(len(ids), bool)
    keep[order[: top_k or len(ids)]] = True
    q = np.where(keep, p, 0)[order]
    cum = np.cumsum(q / q.sum())
    keep[order[np.searchsorted(cum, top_p) + 1 :]] = False
    p = np.where(keep, p, 0)
    return dict(zip(ids.tolist(), p / p.sum(), strict=True))


@pytest.mark.parametrize(
    "kw", [{}, {"top_k": 5}, {"top_p": 0.6}, {"temp": 0.5, "top_p": 0.9, "top_k": 20}]
)
@pytest.mark.parametrize("max_sparse_ids", [0, 1000])
def test_draws_follow_the_softmax_over_allowed_ids(setup, kw, max_sparse_ids):
    """Both paths (sparse: allowed ids only; dense: full-vocabulary masking) draw
    from the softmax over the allowed ids, with top-k and top-p applied."""
    logits, allowed = setup
    ids = allowed[1]
    n = 4000
    tok = _many(logits, 1, ids, n, Sampler(V, max_sparse_ids=max_sparse_ids), **kw)
    expected = _expected(logits, 1, ids, **kw)
    assert set(tok.tolist()) <= {i for i, p in expected.items() if p > 0}
    for i, p in expected.items():
        assert abs((tok == i).mean() - p) < 0.03, (i, p)


def test_top_k_one_and_tiny_top_p_are_greedy(setup):
    logits, allowed = setup
    s = Sampler(V)
    g = s.sample(logits.clone(), _batch(6, temp=0.0), StepConstraints(mask=_mask(6, allowed)))
    for kw in ({"top_k": 1}, {"top_p": 1e-6}):
        assert (
            s.sample(
                logits.clone(), _batch(6, seed=9, **kw), StepConstraints(mask=_mask(6, allowed))
            )
            == g
        ).all()


def test_bans_forced_tokens_and_an_all_banned_row(setup):
    logits, allowed = setup
    s = Sampler(V)
    g = s.sample(logits.clone(), _batch(6, temp=0.0), StepConstraints(mask=_mask(6, allowed)))
    cons = StepConstraints(
        mask=_mask(6, allowed),
        ban_rows=np.array([0, 4, 3]),
        ban_ids=np.array([g[0], g[4], V - 1]),
        forced_rows=np.array([5]),
        forced_ids=np.array([17]),
    )
    t = s.sample(logits.clone(), _batch(6, temp=0.0), cons)
    assert t[0] != g[0] and t[0] in allowed[0]
    assert t[4] != g[4]
    assert t[3] == V - 1  # its only allowed id was banned: the ban is lifted
    assert t[5] == 17


def test_a_row_that_allows_nothing_gives_minus_one():
    s = Sampler(V)
    buf = torch.zeros((1, bitmask_words(V)), dtype=torch.int32)
    t = s.sample(
        torch.zeros((1, V)), _batch(1), StepConstraints(mask=FilledMask(buf, np.array([0])))
    )
    assert t[0] == -1


def test_rows_in_place_draw_what_a_copy_draws():
    """The pass over some rows runs in place, run by run: the same draws as the pass
    over a gathered copy, and the other rows untouched."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, V)).astype(np.float32)
    x[5, ::2] = -np.inf
    x[9] = -np.inf  # a row with nothing allowed
    for rows in (np.array([0]), np.array([3, 4, 5, 9, 20, 21, 39]), np.arange(0, 40, 3)):
        inv_t, u = rng.uniform(0.5, 2.0, len(rows)), rng.random(len(rows))
        expected = _inverse_cdf_np(x[rows].copy(), inv_t, u)
        work = x.copy()
        got = _inverse_cdf_np_rows(work, rows, inv_t, u)
        assert (got == expected).all()
        others = np.setdiff1d(np.arange(40), rows)
        assert np.array_equal(work[others], x[others])


def test_a_mixed_batch_draws_each_row_as_alone():
    """Sparse, dense, greedy and unconstrained rows interleaved in one batch: each row
    draws what it draws in a batch of its own with the same uniform."""
    rng = np.random.default_rng(4)
    n = 12
    logits = torch.from_numpy(rng.standard_normal((n, V)).astype(np.float32))
    allowed = {r: rng.choice(V, 30, replace=False) for r in range(0, n, 3)}
    allowed |= {r: np.flatnonzero(rng.random(V) < 0.7) for r in range(1, n, 3)}
    batch = _batch(n, seed=5)
    batch.temperature[[2, 7]] = 0.0
    batch.temperature[[4, 5]] = 0.7
    s = Sampler(V, max_sparse_ids=1000)
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
