"""Bitmask fill per step: the engine's `BitmaskFiller` against the usual way.

The usual way: every step, a fresh bitmask from ``xgr.allocate_token_bitmask`` (pinned
where CUDA is present, since it will be copied to the GPU), then a Python loop calling
``matcher.fill_next_token_bitmask(bitmask, i)`` per row. The engine's way: one buffer
allocated once for the largest batch (pinned and double-buffered on CUDA), a plain loop
below its batch threshold and xgrammar's ``BatchGrammarMatcher`` above it.

Both fill the same matchers, at the same states (`bench.states`); filling does not
change a matcher's state. The engine's rows are checked equal to the baseline's once
per batch size. The fill runs on the CPU on every device; on CUDA only the memory
(pinned) differs, and the timing brackets it with CUDA events all the same.
"""

from __future__ import annotations

import argparse

import torch

from structured_output.bitmask import BitmaskFiller
from structured_output.guide import RequestGuide

from . import states
from .common import Method, Record, environment, p50, pair_records, side_by_side


def _methods(
    filler: BitmaskFiller, matchers: list, vocab_rows: int, cuda: bool
) -> dict[str, Method]:
    import xgrammar as xgr

    b = len(matchers)
    guides = [RequestGuide(None, m) for m in matchers]
    index = list(range(b))

    def baseline_step() -> torch.Tensor:
        mask = xgr.allocate_token_bitmask(b, vocab_rows)
        if cuda:
            mask = mask.pin_memory()
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, i)
        return mask

    def alloc_only() -> torch.Tensor:
        mask = xgr.allocate_token_bitmask(b, vocab_rows)
        return mask.pin_memory() if cuda else mask

    return {
        "engine": lambda: lambda: filler.fill(index, guides),
        "baseline": lambda: baseline_step,
        #: the baseline's allocation alone, to tell its two costs apart
        "alloc": lambda: alloc_only,
    }


def run(args: argparse.Namespace) -> list[Record]:
    cuda = args.device.startswith("cuda")
    env = environment()
    records: list[Record] = []
    biggest = max(args.batch_sizes)
    for vocab_name in args.vocabs:
        v = states.vocab(vocab_name)
        rows = states.make_rows(vocab_name, biggest, args.seed, args.grammars)
        filler = BitmaskFiller(
            biggest,
            v.vocab_rows,
            pin_memory=cuda,
            num_buffers=2 if cuda else 1,
            max_threads=args.fill_threads,
        )
        for b in args.batch_sizes:
            matchers = [r.matcher for r in rows[:b]]

            methods = _methods(filler, matchers, v.vocab_rows, cuda)
            ours, theirs = methods["engine"]()(), methods["baseline"]()()
            if not torch.equal(ours.buffer[:b], theirs):
                where = f"{vocab_name}, batch {b}"
                raise AssertionError(f"fill: engine and baseline masks differ ({where})")
            times = side_by_side(methods, iters=args.iters, warmup=args.warmup, device=args.device)
            alloc = times.pop("alloc")
            records += pair_records(
                "fill",
                times,
                device=args.device,
                vocab=vocab_name,
                vocab_rows=v.vocab_rows,
                batch_size=b,
                iters=args.iters,
                warmup=args.warmup,
                seed=args.seed,
                grammars=args.grammars,
                env=env,
                extra={
                    "baseline_alloc_median_us": round(p50(alloc), 1),
                    "batch_threshold": filler.batch_threshold,
                    "fill_threads": args.fill_threads,
                    "mean_prefix_tokens": round(sum(len(r.prefix) for r in rows[:b]) / b, 1),
                },
            )
    return records
