"""``thinkgate bench sample``: one sampling step per sampling-settings mix, the engine's
`Sampler` against a full sort of the vocabulary, the way vLLM's sampler applies top-k
and top-p.

Mixes (every row temperature 1, no mask):

- ``plain``: no top-k, no top-p;
- ``top_k``: every row ``top_k=20``;
- ``top_p``: every row ``top_p=0.8``;
- ``mixed``: one row in five ``top_k=20``, one in five ``top_p=0.8``, the rest plain.

Logits (seeded, float32 ``[batch, vocab_rows]``, a fresh copy per timed call, the copy
not timed): ``normal``, standard normal times 3, a flat distribution whose top-p 0.8
spans thousands of ids; ``peaked``, Zipf-like (logit ``-1.2 ln(rank)`` plus noise over a
random permutation), as a language model's next-token distribution is.

- engine: ``Sampler.sample`` (top-k rows from a partial top-k, top-p rows from a
  histogram of their weights; no sort of the vocabulary).
- baseline: when any row of the batch has top-k or top-p, every row's logits are
  sorted, the ids past top-k and past top-p masked, and the rows scattered back;
  then softmax and an exponential race (``argmax(p / Exp(1))``) draw the tokens; a
  plain batch skips the sort.

Each call's tokens are checked: a top-k row's token is among its 20 best ids, a
top-p row's token among the smallest set of ids holding 80 % of its mass.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from engine_core.sampler import Sampler, SamplingBatch, StepConstraints

from .common import Method, Record, environment, pair_records, side_by_side

TOP_K, TOP_P = 20, 0.8


def settings(mix: str, n: int, rng: np.random.Generator) -> SamplingBatch:
    top_k = np.zeros(n, np.int64)
    top_p = np.ones(n, np.float32)
    if mix == "top_k":
        top_k[:] = TOP_K
    elif mix == "top_p":
        top_p[:] = TOP_P
    elif mix == "mixed":
        top_k[0::5] = TOP_K
        top_p[1::5] = TOP_P
    return SamplingBatch(np.ones(n, np.float32), top_p, top_k, rng.random(n))


def make_logits(kind: str, n: int, vocab: int, gen: torch.Generator, dev) -> torch.Tensor:
    if kind == "normal":
        return torch.randn((n, vocab), generator=gen, device=dev) * 3
    rank = torch.arange(1, vocab + 1, device=dev, dtype=torch.float32)
    base = -1.2 * torch.log(rank)
    x = base + 0.3 * torch.randn((n, vocab), generator=gen, device=dev)
    perm = torch.argsort(torch.rand((n, vocab), generator=gen, device=dev), dim=1)
    return torch.gather(x, 1, perm)


def baseline_sample(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, q):
    """Full-sort top-k/top-p (only when a row asks for either), then an exponential
    race. ``logits`` is overwritten; ``q`` a tensor to fill with Exp(1) draws."""
    vocab = logits.shape[1]
    if bool(((top_k > 0) | (top_p < 1)).any()):
        srt, idx = logits.sort(dim=-1, descending=False)
        k = torch.where(top_k > 0, top_k, vocab)
        kth = srt.gather(1, (vocab - k).clamp(min=0).unsqueeze(1))
        srt.masked_fill_(srt < kth, float("-inf"))
        probs = srt.softmax(dim=-1)
        cum = probs.cumsum(dim=-1)
        cut = cum <= (1 - top_p).unsqueeze(1)
        cut[:, -1] = False  # the most likely id always stays
        srt.masked_fill_(cut, float("-inf"))
        logits.scatter_(1, idx, srt)
    probs = logits.softmax(dim=-1)
    q.exponential_()
    return probs.div_(q).argmax(dim=-1).cpu().numpy()


def check(mix: str, x: np.ndarray, batch: SamplingBatch, tokens: np.ndarray, name: str) -> None:
    """Each token is one its row's settings allow (checked on a few rows of each kind)."""
    for r in range(min(len(tokens), 25)):
        row = x[r].astype(np.float64)
        t = int(tokens[r])
        assert 0 <= t < len(row), f"sample {mix}: {name} drew {t} in row {r}"
        if batch.top_k[r] > 0:
            assert row[t] >= np.sort(row)[-batch.top_k[r]], f"{name}: row {r} past top-k"
        elif batch.top_p[r] < 1:
            p = np.exp(row - row.max())
            p /= p.sum()
            order = np.argsort(-p)
            n_keep = int(np.searchsorted(np.cumsum(p[order]), batch.top_p[r])) + 1
            assert p[t] >= p[order[n_keep - 1]] * (1 - 1e-6), f"{name}: row {r} past top-p"


def run(args: argparse.Namespace) -> list[Record]:
    from tokenization.bundled import BUNDLED

    dev = torch.device(args.device)
    env = environment()
    records: list[Record] = []
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    for vocab_name in args.vocabs:
        vocab = BUNDLED[vocab_name].vocab_rows
        sampler = Sampler(vocab)
        for kind in args.logits:
            for b in args.batch_sizes:
                logits = make_logits(kind, b, vocab, gen, dev)
                host = logits.cpu().numpy()
                for mix in args.mixes:
                    batch = settings(mix, b, rng)
                    got: dict[str, np.ndarray] = {}
                    methods = _methods(sampler, logits, batch, got, rng)
                    for name, method in methods.items():
                        method()()
                        check(mix, host, batch, got[name], name)
                    times = side_by_side(
                        methods, iters=args.iters, warmup=args.warmup, device=args.device
                    )
                    records += pair_records(
                        "sample",
                        times,
                        device=args.device,
                        vocab=vocab_name,
                        vocab_rows=vocab,
                        batch_size=b,
                        iters=args.iters,
                        warmup=args.warmup,
                        seed=args.seed,
                        grammars=[],
                        env=env,
                        extra={"mix": mix, "logits": kind, "top_k": TOP_K, "top_p": TOP_P},
                    )
                    e = records[-2]
                    print(
                        f"  {vocab_name} {kind:<7}{mix:<7} batch {b:>4}: engine "
                        f"{e.median_us / 1e3:8.1f} ms, baseline {records[-1].median_us / 1e3:8.1f}"
                        f" ms",
                        flush=True,
                    )
    return records


def _methods(
    sampler: Sampler,
    logits: torch.Tensor,
    batch: SamplingBatch,
    got: dict[str, np.ndarray],
    rng: np.random.Generator,
) -> dict[str, Method]:
    dev = logits.device
    work = torch.empty_like(logits)
    q = torch.empty_like(logits)
    top_k = torch.from_numpy(batch.top_k).to(dev)
    top_p = torch.from_numpy(batch.top_p).to(dev)
    cons = StepConstraints()

    def engine():
        work.copy_(logits)
        batch.uniforms = rng.random(len(batch.uniforms))
        return lambda: got.__setitem__("engine", sampler.sample(work, batch, cons))

    def baseline():
        work.copy_(logits)
        return lambda: got.__setitem__("baseline", baseline_sample(work, top_k, top_p, q))

    return {"engine": engine, "baseline": baseline}


def table(records: list[Record]) -> str:
    """Per (logits, batch): each mix's engine and baseline medians, and each engine
    median over the engine's plain one (what a mix costs more than plain sampling)."""
    by: dict[tuple[str, str, int], dict[str, dict[str, Record]]] = {}
    for r in records:
        key = (r.vocab, r.extra["logits"], r.batch_size)
        by.setdefault(key, {}).setdefault(r.extra["mix"], {})[r.method] = r
    head = (
        f"{'vocab':<14}{'logits':<8}{'batch':>6}  {'mix':<7}{'engine p50':>12}"
        f"{'baseline p50':>14}{'b/a':>8}{'engine / plain':>16}"
    )
    lines = [head, "-" * len(head)]
    for (vocab, kind, b), mixes in by.items():
        plain = mixes.get("plain", {}).get("engine")
        for mix, m in mixes.items():
            e, base = m["engine"], m["baseline"]
            rel = f"{e.median_us / plain.median_us:.2f}x" if plain else "-"
            lines.append(
                f"{vocab:<14}{kind:<8}{b:>6}  {mix:<7}{e.median_us / 1e3:>9.1f} ms"
                f"{base.median_us / 1e3:>11.1f} ms{e.ratio:>7.2f}x{rel:>16}"
            )
    return "\n".join(lines)
