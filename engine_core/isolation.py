"""When a batched operation of a step raises, find the rows at fault.

The mask fill and the sampling run over the whole batch in one call. Should one
raise, it is run again row by row: the rows that fail alone end with an error, and
the others go on with the results of a batched call over the good rows only (or their
single-row results, for the sampling). Only the failure path costs anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

from structured_output.bitmask import FilledMask
from structured_output.guide import RequestGuide

from .sampler import Sampler, SamplingBatch, StepConstraints

log = logging.getLogger(__name__)

T = TypeVar("T")

#: ``fail(row, exception)``: end that batch row's request with an error
Fail = Callable[[int, BaseException], None]


def fill_isolating(
    fill: Callable[[Sequence[int], Sequence[RequestGuide]], FilledMask],
    rows: list[int],
    guides: list[RequestGuide],
    error: BaseException,
    fail: Fail,
) -> FilledMask | None:
    """The batched ``fill(rows, guides)`` raised ``error``: fill each row alone to
    find the failing ones, then the good rows together. Returns their mask (None if
    no row is left)."""
    log.warning("the mask fill of %d rows failed (%s); filling row by row", len(rows), repr(error))
    good_rows: list[int] = []
    good_guides: list[RequestGuide] = []
    for row, guide in zip(rows, guides, strict=True):
        try:
            fill([row], [guide])
        except Exception as e:  # noqa: BLE001 - that row's request ends with it
            fail(row, e)
        else:
            good_rows.append(row)
            good_guides.append(guide)
    if not good_rows:
        return None
    try:
        return fill(good_rows, good_guides)
    except Exception as e:  # noqa: BLE001 - fails only as a batch: no row is to blame
        for row in good_rows:
            fail(row, e)
        return None


def sample_isolating(
    sampler: Sampler,
    logits: torch.Tensor,
    batch: SamplingBatch,
    cons: StepConstraints,
    live: Sequence[bool],
    error: BaseException,
    fail: Fail,
) -> np.ndarray:
    """The batched sampling raised ``error``: sample each live row alone. A row that
    fails ends with an error; its token is -1."""
    n = logits.shape[0]
    log.warning("sampling a batch of %d rows failed (%s); sampling row by row", n, repr(error))
    tokens = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        if not live[i]:
            continue
        try:
            tokens[i] = sampler.sample(logits[i : i + 1], batch_row(batch, i), cons_row(cons, i))[0]
        except Exception as e:  # noqa: BLE001 - that row's request ends with it
            fail(i, e)
    return tokens


def batch_row(batch: SamplingBatch, i: int) -> SamplingBatch:
    s = slice(i, i + 1)
    return SamplingBatch(batch.temperature[s], batch.top_p[s], batch.top_k[s], batch.uniforms[s])


def cons_row(cons: StepConstraints, i: int) -> StepConstraints:
    """Row ``i`` of a step's constraints, as row 0 of a batch of one."""
    mask = None
    if cons.mask is not None and i in cons.mask.rows:
        mask = FilledMask(cons.mask.buffer[i : i + 1], np.zeros(1, dtype=np.int64))
    bans = cons.ban_rows == i
    forced = cons.forced_rows == i
    return StepConstraints(
        mask=mask,
        ban_rows=np.zeros(int(bans.sum()), dtype=np.int64),
        ban_ids=cons.ban_ids[bans],
        forced_rows=np.zeros(int(forced.sum()), dtype=np.int64),
        forced_ids=cons.forced_ids[forced],
    )
