"""What one step gives the sampler besides the logits, gathered while the forward
pass runs: each row's constraints (its guide's mask, bans and forced token; its stop
tokens banned while it is under ``min_tokens``) and its sampling settings.

A row whose guide raises, or whose mask cannot be filled, ends (through ``fail``) and
is marked not live; the others' constraints are gathered as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from structured_output.bitmask import FilledMask
from structured_output.guide import RequestGuide

from .isolation import fill_isolating
from .request import EngineRequest
from .sampler import SamplingBatch, StepConstraints

#: ``fail(row, exception, stage)``: end that batch row's request with an error
Fail = Callable[[int, BaseException, str], None]
Fill = Callable[[Sequence[int], Sequence[RequestGuide]], FilledMask]


def gather_constraints(
    batch: list[EngineRequest], fill: Fill, fail: Fail
) -> tuple[StepConstraints, list[bool]]:
    """Feed each row's last token to its guide, then gather the step's masks (one
    batched ``fill``), bans and forced tokens. Returns them and which rows are still
    live."""
    live = [True] * len(batch)
    fill_rows: list[int] = []
    fill_guides: list[RequestGuide] = []
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    forced_rows: list[int] = []
    forced_ids: list[int] = []
    for i, r in enumerate(batch):
        g = r.guide
        tok, r.pending = r.pending, None
        if g is not None:
            try:
                if tok is not None:
                    g.accept(tok, r.output_ids)
                if g.needs_mask:
                    fill_rows.append(i)
                    fill_guides.append(g)
                elif g.thinking:
                    f = g.forced_token()
                    if f is not None:
                        forced_rows.append(i)
                        forced_ids.append(f)
                    if g.banned:
                        ban_rows.extend([i] * len(g.banned))
                        ban_ids.extend(g.banned)
            except Exception as e:  # noqa: BLE001 - ends this request only
                live[i] = False
                fail(i, e, "feeding its last token to its guide")
                continue
        if len(r.output_ids) < r.min_tokens and r.stop_ids:
            ban_rows.extend([i] * len(r.stop_ids))
            ban_ids.extend(r.stop_ids)
    mask = None
    if fill_rows:
        try:
            mask = fill(fill_rows, fill_guides)
        except Exception as e:  # noqa: BLE001 - find the rows at fault

            def fail_fill(i: int, exc: BaseException) -> None:
                live[i] = False
                fail(i, exc, "filling its token mask")

            mask = fill_isolating(fill, fill_rows, fill_guides, e, fail_fill)
    cons = StepConstraints(
        mask=mask,
        ban_rows=np.asarray(ban_rows, dtype=np.int64),
        ban_ids=np.asarray(ban_ids, dtype=np.int64),
        forced_rows=np.asarray(forced_rows, dtype=np.int64),
        forced_ids=np.asarray(forced_ids, dtype=np.int64),
    )
    return cons, live


def sampling_batch(batch: list[EngineRequest], rng: np.random.Generator) -> SamplingBatch:
    """Each row's settings and this step's uniform draw (from the request's own
    generator when it has a seed)."""
    n = len(batch)
    u = rng.random(n)
    for i, r in enumerate(batch):
        if r.generator is not None:
            u[i] = r.generator.random()
    return SamplingBatch(
        temperature=np.fromiter((r.temperature for r in batch), np.float32, n),
        top_p=np.fromiter((r.top_p for r in batch), np.float32, n),
        top_k=np.fromiter((r.top_k for r in batch), np.int64, n),
        uniforms=u,
    )
