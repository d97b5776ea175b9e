"""Bitmask fill per step: the engine's `BitmaskFiller` against what a vLLM user runs.

- ``engine``: the engine as configured. Grammars compiled as the engine compiles them
  (sealed special tokens, xgrammar's unbounded whitespace) and guarded
  (`structured_output.guard`: whitespace runs bounded to the engine's default, UTF-8
  kept valid); one buffer allocated once for the largest batch (pinned and
  double-buffered on CUDA), a plain loop below its batch threshold and above it two
  threads sharing the rows in chunks (`structured_output.bitmask.SharedFill`), each
  row guarded right after its fill.
- ``baseline``: what a vLLM user runs today for the same request. xgrammar's default
  compilation of the same schema or tag (any whitespace, no bound, the vocabulary as
  it is), and every step a fresh bitmask from ``xgr.allocate_token_bitmask`` (pinned
  where CUDA is present) filled by a Python loop of ``matcher.fill_next_token_bitmask``.
- ``loop``: the old self-comparison. The engine's own guarded matchers filled by that
  same per-row loop into a fresh bitmask (the guard then runs row by row).
- ``bound_off``: the engine as a user runs it with the whitespace bound off
  (``--json-max-whitespace none``): the same filler and grammars, guarded by the table
  without a bound (UTF-8, escapes and control characters are still kept). What the
  bound costs is ``engine / bound_off``.
- ``unguarded``: the engine's filler with no guard at all (not a configuration the
  engine runs: its masks are the grammar's alone); ``engine / unguarded`` is what the
  whole guard costs.
- ``unkept``: the engine as configured, but its matchers keep no mask inside free JSON
  strings and remember none mid-escape (`structured_output.string_masks`): every row
  filled every step. ``unkept / engine`` is what both save.

Without ``--walk``, every step fills the same states, each left as a decode that wrote
the row's prefix token by token leaves it (`states.decoded_rows`): a row inside a free
string copies its kept mask, a row at a string's start fills and checks, step after
step.

Each method has its own matchers, all in the same states (`bench.states`); filling
does not change a matcher's state.
Checked once per batch size: ``engine`` equals ``loop`` exactly, and equals
``baseline`` with the guard's masks applied on every ordinary id (special tokens are
sealed in the engine's grammars and plain text in the baseline's). The fill runs on
the CPU on every device; on CUDA only the memory (pinned) differs, and the timing
brackets it with CUDA events all the same.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
import torch

from structured_output.bitmask import BitmaskFiller, fill_threads_for
from structured_output.guide import RequestGuide

from . import states
from .common import (
    Method,
    Record,
    environment,
    helper_start_us,
    p50,
    pair_records,
    side_by_side,
    threads_line,
)
from .common import _us as us

METHODS = ("engine", "baseline", "loop", "bound_off", "unguarded", "unkept")


def _methods(
    filler: BitmaskFiller,
    bound_off: BitmaskFiller,
    unguarded: BitmaskFiller,
    rows: list[states.Row],
    vocab_rows: int,
    cuda: bool,
) -> dict[str, Method]:
    import xgrammar as xgr

    b = len(rows)
    guides = [RequestGuide(None, r.matcher) for r in rows]
    free = [RequestGuide(None, r.unbounded) for r in rows]
    bare = [RequestGuide(None, r.bare) for r in rows]
    unkept = [RequestGuide(None, r.unkept) for r in rows]
    ours = [r.matcher for r in rows]
    theirs = [r.peer for r in rows]
    index = list(range(b))

    def fresh() -> torch.Tensor:
        mask = xgr.allocate_token_bitmask(b, vocab_rows)
        return mask.pin_memory() if cuda else mask

    def loop(matchers: list) -> torch.Tensor:
        mask = fresh()
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, i)
        return mask

    return {
        "engine": lambda: lambda: filler.fill(index, guides),
        "baseline": lambda: lambda: loop(theirs),
        "loop": lambda: lambda: loop(ours),
        "bound_off": lambda: lambda: bound_off.fill(index, free),
        "unguarded": lambda: lambda: unguarded.fill(index, bare),
        "unkept": lambda: lambda: filler.fill(index, unkept),
        #: the per-step allocation alone, to tell the loops' two costs apart
        "alloc": lambda: fresh,
    }


def check(
    vocab: states.Vocab, rows: list[states.Row], engine: torch.Tensor, methods: dict[str, Method]
) -> None:
    """``engine`` equals the per-row loop over the same matchers, and the baseline's
    masks with each row's guard mask applied, on every ordinary id; with the bound
    off, the engine allows all it allowed with it (and more only where a bound bites)."""
    b = len(rows)
    where = f"{vocab.name}, batch {b}"
    if not torch.equal(engine[:b], methods["loop"]()()):
        raise AssertionError(f"fill: the engine's filler and its per-row loop differ ({where})")
    table = states.guard(vocab.name)
    peer = methods["baseline"]()().numpy().view(np.uint32)
    guarded = np.stack(
        [
            peer[i] & table.allowed(r.matcher.guard_state, r.matcher.guard_lenient)
            for i, r in enumerate(rows)
        ]
    )
    ordinary = _ordinary_words(vocab)
    ours = engine[:b].numpy().view(np.uint32)
    if not np.array_equal(ours & ordinary, guarded & ordinary):
        raise AssertionError(f"fill: the engine and the baseline's grammar differ ({where})")
    free = methods["bound_off"]()().buffer[:b].numpy().view(np.uint32)
    if (ours & ~free).any():
        raise AssertionError(f"fill: the bound off refuses what the bound allows ({where})")


def _ordinary_words(vocab: states.Vocab) -> np.ndarray:
    """The ids that are not special tokens, as mask words."""
    special = np.zeros(-(-vocab.vocab_rows // 32) * 32, dtype=bool)
    special[[*vocab.tokenizer.special_ids, *vocab.markers.values()]] = True
    special[vocab.vocab_rows :] = True
    return np.packbits(~special, bitorder="little").view(np.uint32)


def run(args: argparse.Namespace) -> list[Record]:
    cuda = args.device.startswith("cuda")
    env = environment()
    start_delay = round(helper_start_us(), 1)
    records: list[Record] = []
    biggest = max(args.batch_sizes)
    for vocab_name in args.vocabs:
        v = states.vocab(vocab_name)
        rows = states.make_rows(
            vocab_name,
            biggest,
            args.seed,
            args.grammars,
            peer=True,
            unbounded=True,
            bare=True,
            unkept=True,
        )
        engine, bound_off, unguarded = (
            BitmaskFiller(
                biggest,
                v.vocab_rows,
                pin_memory=cuda,
                num_buffers=2 if cuda else 1,
                max_threads=fill_threads_for(args.fill_threads),
                guard=guard,
            )
            for guard in (states.guard(vocab_name), states.guard(vocab_name, None), None)
        )
        # the same states every step: each as a decode leaves it, step after step
        decoded = None if args.walk else states.decoded_rows(rows)
        for b in args.batch_sizes:
            methods = _methods(engine, bound_off, unguarded, rows[:b], v.vocab_rows, cuda)
            check(v, rows[:b], methods["engine"]()().buffer, methods)
            if args.walk:
                step = lambda rows=rows[:b]: states.advance(rows)  # noqa: E731
            else:
                step = decoded(b)
            times = side_by_side(
                methods, iters=args.iters, warmup=args.warmup, device=args.device, between=step
            )
            if args.walk:  # the masks agree where the walk stopped too
                check(v, rows[:b], methods["engine"]()().buffer, methods)
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
                    "batch_threshold": engine.batch_threshold,
                    "fill_threads": fill_threads_for(args.fill_threads),
                    "helper_start_us": start_delay,
                    "max_whitespace": states.guard(vocab_name).limit,
                    "mean_prefix_tokens": round(sum(len(r.prefix) for r in rows[:b]) / b, 1),
                    "walk": args.walk,
                },
            )
    return records


def table(records: Sequence[Record]) -> str:
    """Per (vocabulary, batch): the engine, the baseline and their ratio; the old
    self-comparison; what the bound and the whole guard cost."""
    by: dict[tuple[str, int], dict[str, Record]] = {}
    for r in records:
        by.setdefault((r.vocab, r.batch_size), {})[r.method] = r
    head = (
        f"{'vocab':<14}{'batch':>6}  {'engine p50':>11}{'/row':>9}  {'baseline p50':>13}"
        f"{'b/e':>7}  {'loop p50':>10}{'l/e':>7}  {'bound off':>10}{'e/boff':>7}"
        f"  {'guard off':>10}{'e/off':>7}  {'unkept':>10}{'u/e':>7}"
    )
    lines = [head, "-" * len(head)]
    for (vocab, b), m in by.items():
        if any(k not in m for k in METHODS):
            continue
        e = m["engine"].median_us
        lines.append(
            f"{vocab:<14}{b:>6}  {us(e):>11}{us(m['engine'].per_row_median_us):>9}"
            f"  {us(m['baseline'].median_us):>13}{m['baseline'].median_us / e:>6.2f}x"
            f"  {us(m['loop'].median_us):>10}{m['loop'].median_us / e:>6.2f}x"
            f"  {us(m['bound_off'].median_us):>10}{e / m['bound_off'].median_us:>6.2f}x"
            f"  {us(m['unguarded'].median_us):>10}{e / m['unguarded'].median_us:>6.2f}x"
            f"  {us(m['unkept'].median_us):>10}{m['unkept'].median_us / e:>6.2f}x"
        )
    if records:
        lines.append(threads_line(records[0].extra))
    return "\n".join(lines)
