"""Prototypes of engine changes, measured side by side with the engine as it is.

``python -m bench.proposals sampler``: a CPU sampler that (1) chooses the sparse path
by the number of allowed tokens instead of the number of non-zero mask words, and (2)
masks the remaining (dense) rows with xgrammar's CPU kernel, whose cost grows with the
number of masked logits, instead of unpacking every bit and rewriting every logit. Rows
inside a JSON string allow ~97% of the vocabulary and rows between keys a few hundred
ids scattered over hundreds of words: the engine's rule (at most 128 non-zero words)
sends both kinds to the full-vocabulary path.

``python -m bench.proposals threshold``: the fill at several batch thresholds.

Nothing here is imported by the engine; the owner decides what to adopt.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from engine_core.sampler import Sampler, SamplingBatch, StepConstraints
from structured_output.apply import words_in_use
from structured_output.bitmask import BitmaskFiller
from structured_output.guide import RequestGuide

from . import states
from .apply import check
from .common import Method, p50, p90, side_by_side

_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int32)


def allowed_counts(words: np.ndarray) -> np.ndarray:
    """Per row of uint32 ``words``, the number of allowed ids (a byte-table popcount)."""
    return _POPCOUNT[np.ascontiguousarray(words).view(np.uint8)].sum(axis=1)


class ProposedSampler(Sampler):
    """`Sampler` with the two CPU changes above; CUDA and everything else unchanged."""

    def __init__(self, vocab_rows: int, *, max_sparse_ids: int | None = None, **kw) -> None:
        super().__init__(vocab_rows, **kw)
        #: a row allowing at most this many ids is sampled from them alone
        self.max_sparse_ids = max_sparse_ids or vocab_rows // 16

    def _sample_cpu(self, logits, batch, cons):
        import xgrammar as xgr

        n = logits.shape[0]
        x = logits.numpy()
        tokens = np.empty(n, dtype=np.int64)
        is_sparse = np.zeros(n, dtype=bool)
        if cons.mask is not None and len(cons.mask.rows):
            rows = cons.mask.rows
            words = cons.mask.buffer.numpy()[rows].view(np.uint32)
            small = allowed_counts(words) <= self.max_sparse_ids
            sparse_rows, dense_rows = rows[small], rows[~small]
            is_sparse[sparse_rows] = True
            if len(dense_rows):
                xgr.apply_token_bitmask_inplace(
                    logits,
                    cons.mask.buffer,
                    vocab_size=logits.shape[1],
                    indices=dense_rows.tolist(),
                )
            if len(sparse_rows):
                tokens[sparse_rows] = self._sample_sparse(x, sparse_rows, words[small], batch, cons)
        full_rows = np.flatnonzero(~is_sparse)
        if len(full_rows):
            self._ban_full(x, cons, is_sparse)
            z = logits if len(full_rows) == n else logits[torch.from_numpy(full_rows)]
            tokens[full_rows] = self._sample_full(z, batch, full_rows).numpy()
        return tokens

    def _sample_full(self, z, batch, rows):
        """Plain sampling (temperature > 0, no top-k / top-p) in three in-place passes:
        ``exp(z - max)``, cumulative sum, binary search; other rows as before."""
        temp = batch.temperature[rows]
        if (temp <= 0).any() or (batch.top_k[rows] > 0).any() or (batch.top_p[rows] < 1).any():
            return super()._sample_full(z, batch, rows)
        if not (temp == 1).all():
            z = z / torch.from_numpy(temp).unsqueeze(1)
        e = z.sub_(z.amax(dim=1, keepdim=True)).exp_().cumsum_(dim=1)  # z: logits, or a copy
        target = torch.from_numpy(batch.uniforms[rows]).to(e.dtype) * e[:, -1]
        pick = torch.searchsorted(e, target.unsqueeze(1), right=True).squeeze(1)
        pick.clamp_(max=e.shape[1] - 1)
        before = e.gather(1, (pick - 1).clamp_(min=0).unsqueeze(1)).squeeze(1)
        weight = e.gather(1, pick.unsqueeze(1)).squeeze(1) - torch.where(pick > 0, before, 0)
        bad = weight <= 0  # rounding at the very top of the sum: take the last allowed id
        if bool(bad.any()):
            last = (e[bad] < e[bad, -1:]).sum(dim=1)
            pick[bad] = last
        return pick


def _sampler_methods(samplers, logits, batch, cons, got, rng) -> dict[str, Method]:
    work = torch.empty_like(logits)

    def method(name: str) -> Method:
        def ready():
            work.copy_(logits)
            batch.uniforms = rng.random(len(batch.uniforms))
            return lambda: got.__setitem__(name, samplers[name].sample(work, batch, cons))

        return ready

    return {k: method(k) for k in samplers}


def _fill_method(filler: BitmaskFiller, index: list[int], guides: list) -> Method:
    return lambda: lambda: filler.fill(index, guides)


def _sampler_bench(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    print(f"seed {args.seed}; {args.iters} timed iterations after {args.warmup} warm-up")
    print(
        f"{'vocab':<14}{'batch':>6}{'sparse now':>11}{'proposed':>9}"
        f"{'engine p50':>12}{'p90':>9}{'proposed p50':>14}{'p90':>9}{'speed-up':>10}"
    )
    for vocab_name in args.vocabs:
        v = states.vocab(vocab_name)
        n = v.vocab_rows
        rows = states.make_rows(vocab_name, max(args.batch_sizes), args.seed)
        for b in args.batch_sizes:
            filler = BitmaskFiller(b, n)
            filled = filler.fill(list(range(b)), [RequestGuide(None, r.matcher) for r in rows[:b]])
            mask = filled.buffer.numpy()
            logits = torch.randn((b, n), generator=torch.Generator().manual_seed(args.seed))
            batch = SamplingBatch(
                np.ones(b, np.float32), np.ones(b, np.float32), np.zeros(b, np.int64), rng.random(b)
            )
            cons = StepConstraints(mask=filled)
            samplers = {"engine": Sampler(n), "proposed": ProposedSampler(n)}
            got: dict[str, np.ndarray] = {}

            methods = _sampler_methods(samplers, logits, batch, cons, got, rng)
            t = side_by_side(methods, iters=args.iters, warmup=args.warmup, device="cpu")
            for k in samplers:
                check(k, mask, filled.rows, got[k])
            w = mask[filled.rows].view(np.uint32)
            now = int((words_in_use(w) <= 128).sum())
            new = int((allowed_counts(w) <= n // 16).sum())
            print(
                f"{vocab_name:<14}{b:>6}{now:>11}{new:>9}"
                f"{p50(t['engine']) / 1e3:>9.1f} ms{p90(t['engine']) / 1e3:>6.0f} ms"
                f"{p50(t['proposed']) / 1e3:>11.1f} ms{p90(t['proposed']) / 1e3:>6.0f} ms"
                f"{p50(t['engine']) / p50(t['proposed']):>9.2f}x",
                flush=True,
            )


def _threshold_bench(args: argparse.Namespace) -> None:
    print(f"seed {args.seed}; fill per step (median µs) by the filler's batch_threshold")
    thresholds = [1, 16, 32, 64, 10**9]
    print(
        f"{'vocab':<14}{'batch':>6}"
        + "".join(f"{'t=' + str(t) if t < 10**9 else 'loop':>10}" for t in thresholds)
    )
    for vocab_name in args.vocabs:
        v = states.vocab(vocab_name)
        rows = states.make_rows(vocab_name, max(args.batch_sizes), args.seed)
        for b in args.batch_sizes:
            guides = [RequestGuide(None, r.matcher) for r in rows[:b]]
            fillers = {t: BitmaskFiller(b, v.vocab_rows, batch_threshold=t) for t in thresholds}
            index = list(range(b))
            t = side_by_side(
                {k: _fill_method(f, index, guides) for k, f in fillers.items()},
                iters=args.iters,
                warmup=args.warmup,
                device="cpu",
            )
            print(
                f"{vocab_name:<14}{b:>6}" + "".join(f"{p50(t[k]):>10.0f}" for k in thresholds),
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.proposals",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("what", choices=["sampler", "threshold"])
    ap.add_argument("--vocabs", default="qwen3,o200k_harmony")
    ap.add_argument("--batch-sizes", default="1,8,32,128,256,512")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-threads", type=int, help="torch intra-op threads")
    args = ap.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    args.vocabs = args.vocabs.split(",")
    args.batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    (_sampler_bench if args.what == "sampler" else _threshold_bench)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
