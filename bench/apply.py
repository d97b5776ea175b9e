"""Apply the masks and sample one token per row: the engine's `Sampler` against the
usual way.

The masks are real: filled by the engine's filler (guarded, as configured) from the
states of `bench.states`.
The logits are random normal (seeded), ``[batch, vocab_rows]`` float32, on the device;
every timed call starts from a fresh copy of them (the copy is not timed). Sampling is
plain (temperature 1, no top-k / top-p), as in the baseline.

- engine: ``Sampler.sample(logits, SamplingBatch, StepConstraints(mask=FilledMask))``.
  On a CPU, rows that allow few tokens are sampled from those alone, the rest in one
  batched full-vocabulary pass; on CUDA the pinned mask is copied to the device,
  applied by xgrammar's kernel, and sampled there.
- baseline: ``xgr.apply_token_bitmask_inplace`` then
  ``torch.multinomial(torch.softmax(logits))``; on CUDA with the host-to-device copy
  of the (pinned) mask, and the tokens brought back to the host, as the engine does.

Every sampled token of both methods is checked against its row's mask, so a path that
is fast but wrong fails the bench instead of winning it.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from engine_core.sampler import Sampler, SamplingBatch, StepConstraints
from structured_output.apply import allowed_counts
from structured_output.bitmask import BitmaskFiller, fill_threads_for
from structured_output.guide import RequestGuide

from . import states
from .common import Method, Record, environment, pair_records, side_by_side


def allowed(mask: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Whether ``tokens[i]`` is allowed by row ``rows[i]`` of the int32 ``mask``."""
    words = mask.view(np.uint32)[rows, tokens >> 5]
    return ((words >> (tokens & 31).astype(np.uint32)) & 1).astype(bool)


def check(name: str, mask: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> None:
    t = tokens[rows]
    bad = rows[(t < 0) | ~allowed(mask, rows, np.maximum(t, 0))]
    if len(bad):
        rows_text = bad[:8].tolist()
        raise AssertionError(f"apply: {name} sampled tokens its mask forbids, rows {rows_text}")


def _methods(
    sampler: Sampler,
    logits: torch.Tensor,
    batch: SamplingBatch,
    cons: StepConstraints,
    mask_host: torch.Tensor,
    got: dict[str, np.ndarray],
    rng: np.random.Generator,
) -> dict[str, Method]:
    """Both methods, on a fresh copy of ``logits`` each call; tokens land in ``got``."""
    import xgrammar as xgr

    dev = logits.device
    work = torch.empty_like(logits)

    def engine():
        work.copy_(logits)
        batch.uniforms = rng.random(len(batch.uniforms))
        return lambda: got.__setitem__("engine", sampler.sample(work, batch, cons))

    def baseline():
        work.copy_(logits)

        def step():
            mask = mask_host.to(dev, non_blocking=True) if dev.type == "cuda" else mask_host
            xgr.apply_token_bitmask_inplace(work, mask)
            tok = torch.multinomial(torch.softmax(work, dim=-1), 1).squeeze(1)
            got["baseline"] = tok.cpu().numpy()

        return step

    return {"engine": engine, "baseline": baseline}


def run(args: argparse.Namespace) -> list[Record]:
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    env = environment()
    records: list[Record] = []
    biggest = max(args.batch_sizes)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    for vocab_name in args.vocabs:
        v = states.vocab(vocab_name)
        n = v.vocab_rows
        rows = states.make_rows(vocab_name, biggest, args.seed, args.grammars)
        sampler = Sampler(n)
        for b in args.batch_sizes:
            filler = BitmaskFiller(
                b,
                n,
                pin_memory=cuda,
                max_threads=fill_threads_for(args.fill_threads),
                guard=states.guard(vocab_name),
            )
            filled = filler.fill(list(range(b)), [RequestGuide(None, r.matcher) for r in rows[:b]])
            mask_host = filled.buffer[:b]  # pinned on CUDA
            logits = torch.randn((b, n), generator=gen, device=dev, dtype=torch.float32)
            batch = SamplingBatch(
                temperature=np.ones(b, np.float32),
                top_p=np.ones(b, np.float32),
                top_k=np.zeros(b, np.int64),
                uniforms=rng.random(b),
            )
            cons = StepConstraints(mask=filled)
            got: dict[str, np.ndarray] = {}
            methods = _methods(sampler, logits, batch, cons, mask_host, got, rng)
            mask_np = mask_host.numpy()
            masked_rows = filled.rows
            all_rows = np.arange(b)
            for name, method in methods.items():
                method()()
                check(name, mask_np, masked_rows if name == "engine" else all_rows, got[name])
            times = side_by_side(methods, iters=args.iters, warmup=args.warmup, device=args.device)
            check("engine", mask_np, masked_rows, got["engine"])
            check("baseline", mask_np, all_rows, got["baseline"])
            words = mask_np.view(np.uint32)
            allowed_per_row = np.unpackbits(words.view(np.uint8), axis=1).sum(axis=1)
            records += pair_records(
                "apply",
                times,
                device=args.device,
                vocab=vocab_name,
                vocab_rows=n,
                batch_size=b,
                iters=args.iters,
                warmup=args.warmup,
                seed=args.seed,
                grammars=args.grammars,
                env=env,
                extra={
                    "masked_rows": int(len(masked_rows)),
                    "sparse_rows": int(
                        (allowed_counts(words[masked_rows]) <= sampler.max_sparse_ids).sum()
                    ),
                    "median_allowed_tokens": int(np.median(allowed_per_row)),
                },
            )
    return records
