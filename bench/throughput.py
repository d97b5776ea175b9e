"""Throughput against transformers: the engine with the batched runner, and what a
transformers user runs on the same model, prompts and lengths.

Every method generates greedily for the same ``--requests`` prompts (chat-formatted
user messages of varied lengths, tokenized with the model's vocabulary):

- ``engine``: the engine process (batched runner, ``max_num_seqs = --batch-size``),
  every request submitted at once through `EngineClient`; timed from the first
  submission to the last final output;
- ``hf_padded``: transformers' ``generate`` on left-padded batches of ``--batch-size``;
- ``hf_continuous``: transformers' continuous batching (``generate_batch``), sized for
  the work (pages of 64 tokens, ``--batch-size`` requests per batch), unconstrained only;
- ``engine_one`` and ``hf_one``: one sequence at a time (the engine with
  ``max_num_seqs = 1``; ``generate`` on one prompt), on ``--batch-size // 8`` prompts
  (at least 2): what batching buys.

Unconstrained, each request writes exactly ``--new-tokens`` tokens. Constrained, each
request gets a grammar of the bench mix in turn (JSON schemas, a forced hermes tool
call, JSON mode), compiled exactly as the engine compiles it; it ends at the grammar's
end or at ``--new-tokens``; transformers applies the same grammars through xgrammar's
logits processor for transformers (`xgrammar.contrib.hf.LogitsProcessor`, one matcher
per row). Tokens per second count the tokens each method wrote.

The methods run in turn, in a rotating order, ``--warmup`` untimed rounds then
``--iters`` timed ones; a record gives the median over the timed rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine_core.client import EngineClient
from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, SamplingParams, StructuredOutputSpec
from structured_output.config import StructuredOutputConfig

from . import states
from .common import Record, environment

UNCONSTRAINED = ("engine", "hf_padded", "hf_continuous", "engine_one", "hf_one")
CONSTRAINED = ("engine", "hf_padded", "engine_one", "hf_one")

_WORDS = (
    "weather city forecast tomorrow rain wind please tell me about the call a tool "
    "in Paris Tokyo Lima how much what is temperature week plan trip"
).split()


def prompts_for(tok, n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """``n`` chat prompts of ``lo`` to ``hi`` tokens, thinking switched off."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        want = rng.randrange(lo, hi + 1)
        words: list[str] = []
        ids: list[int] = []
        while True:
            text = (
                "<|im_start|>user\n" + " ".join(words) + "<|im_end|>\n<|im_start|>assistant\n"
                "<think>\n\n</think>\n\n"
            )
            ids = tok.encode(text)
            if len(ids) >= want:
                break
            words.append(rng.choice(_WORDS))
        out.append(ids)
    return out


def _spec(grammar: str) -> StructuredOutputSpec:
    if grammar == "builtin_json":
        return StructuredOutputSpec("json_object")
    s = states.SPECS[grammar]
    return StructuredOutputSpec(s.kind.value, s.value)


class _Engines:
    """The engine processes (batch and one-at-a-time), spawned once."""

    def __init__(self, args: argparse.Namespace, tokenizer: str) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.clients: dict[int, EngineClient] = {}

    async def client(self, batch: int) -> EngineClient:
        if batch not in self.clients:
            config = EngineConfig(
                model=self.args.model,
                tokenizer=self.tokenizer,
                device=self.args.device,
                dtype=self.args.dtype,
                max_num_seqs=batch,
                max_num_batched_tokens=max(2048, batch),
                seed=self.args.seed,
                log_level="WARNING",
                structured_output=StructuredOutputConfig(compile_workers=self.args.compile_workers),
            )
            threads = self.args.engine_torch_threads
            saved = os.environ.get("OMP_NUM_THREADS")
            if threads:  # the spawned engine's torch reads it at start
                os.environ["OMP_NUM_THREADS"] = str(threads)
            try:
                self.clients[batch] = await EngineClient.spawn(config, startup_timeout_s=600)
            finally:
                if threads:
                    if saved is None:
                        os.environ.pop("OMP_NUM_THREADS", None)
                    else:
                        os.environ["OMP_NUM_THREADS"] = saved
        return self.clients[batch]

    async def close(self) -> None:
        for c in self.clients.values():
            await c.shutdown()


async def _engine_run(client: EngineClient, prompts, specs, new_tokens: int, tag: str) -> int:
    async def one(i: int) -> int:
        spec = specs[i] if specs else None
        sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=spec is None)
        req = EngineCoreRequest(f"{tag}-{i}", prompts[i], sp, spec, reasoning_ended=True)
        n = 0
        async for out in client.generate(req):
            n += len(out.new_token_ids)
            if out.finished and out.error:
                raise RuntimeError(f"throughput: request {i} failed: {out.error}")
        return n

    return sum(await asyncio.gather(*(one(i) for i in range(len(prompts)))))


def _hf_padded(model, prompts, new_tokens: int, batch: int, grammars, stops, pad: int) -> int:
    import xgrammar as xgr
    from transformers import LogitsProcessorList

    total = 0
    for lo in range(0, len(prompts), batch):
        chunk = prompts[lo : lo + batch]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        kwargs: dict[str, Any] = dict(
            max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad, attention_mask=mask
        )
        if grammars:
            proc = xgr.contrib.hf.LogitsProcessor(grammars[lo : lo + batch])
            kwargs.update(logits_processor=LogitsProcessorList([proc]), eos_token_id=stops)
        else:
            kwargs.update(min_new_tokens=new_tokens, eos_token_id=None)
        with torch.inference_mode():
            out = model.generate(ids.to(model.device), **kwargs)[:, width:].tolist()
        for row in out:
            ends = [k for k, t in enumerate(row) if t in stops] if grammars else []
            total += ends[0] + 1 if ends else len(row)
    return total


def _hf_continuous(model, prompts, new_tokens: int, batch: int) -> int:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    longest = max(len(p) for p in prompts) + new_tokens
    pages = -(-longest // 64)
    cb = ContinuousBatchingConfig(
        page_size=64,
        num_blocks=pages * min(batch, len(prompts)) + 8,
        max_batch_tokens=max(2048, batch),
        max_requests_per_batch=batch,
    )
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)
    with torch.inference_mode():
        out = model.generate_batch(
            inputs=prompts, generation_config=gen, continuous_batching_config=cb
        )
    return sum(len(o.generated_tokens) for o in out.values())


@dataclass
class _Work:
    """One mode's requests, and everything the methods run them with."""

    mode: str
    args: argparse.Namespace
    model: Any
    prompts: list[list[int]]
    few: list[list[int]]
    specs: list[StructuredOutputSpec] | None
    grammars: list[Any] | None
    stops: list[int]
    pad: int
    engines: _Engines
    loop: asyncio.AbstractEventLoop

    def call(self, method: str, k: int) -> tuple[int, float]:
        """Run ``method`` once: (tokens written, seconds)."""
        a, n = self.args, self.args.new_tokens
        tag = f"{self.mode}-{method}-{k}"
        few = len(self.few)
        if method.startswith("engine"):
            one = method == "engine_one"
            client = self.loop.run_until_complete(self.engines.client(1 if one else a.batch_size))
            prompts, specs = (
                (self.few, self.specs and self.specs[:few])
                if one
                else (
                    self.prompts,
                    self.specs,
                )
            )
            t0 = time.perf_counter()
            got = self.loop.run_until_complete(_engine_run(client, prompts, specs, n, tag))
            return got, time.perf_counter() - t0
        t0 = time.perf_counter()
        if method == "hf_padded":
            got = _hf_padded(
                self.model, self.prompts, n, a.batch_size, self.grammars, self.stops, self.pad
            )
        elif method == "hf_continuous":
            got = _hf_continuous(self.model, self.prompts, n, a.batch_size)
        else:  # hf_one
            g = self.grammars
            got = sum(
                _hf_padded(self.model, [p], n, 1, g[i : i + 1] if g else None, self.stops, self.pad)
                for i, p in enumerate(self.few)
            )
        return got, time.perf_counter() - t0


def run(args: argparse.Namespace) -> list[Record]:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from structured_output import GrammarSpec
    from structured_output.local import LocalCompiler
    from tokenization import load_tokenizer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    own = Path(args.model, "tokenizer.json").is_file()
    tok_name = args.model if own else "qwen3"
    tok = load_tokenizer(tok_name)
    dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if dtype is None:
        dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, dtype=dtype)
    model = model.to(args.device).eval()
    tok = tok.with_vocab_rows(int(model.config.vocab_size))
    prompts = prompts_for(tok, args.requests, args.min_prompt, args.max_prompt, args.seed)
    stops = list(tok.stop_token_ids)
    compiler = LocalCompiler(tok)
    names = [args.grammars[i % len(args.grammars)] for i in range(len(prompts))]
    compiled = {
        g: compiler.compile(
            GrammarSpec.of("json_object") if g == "builtin_json" else states.SPECS[g]
        )
        for g in set(names)
    }
    engines = _Engines(args, tok_name)
    loop = asyncio.new_event_loop()
    records: list[Record] = []
    try:
        for mode in args.modes:
            constrained = mode == "constrained"
            work = _Work(
                mode=mode,
                args=args,
                model=model,
                prompts=prompts,
                few=prompts[: max(2, args.batch_size // 8)],
                specs=[_spec(g) for g in names] if constrained else None,
                grammars=[compiled[g] for g in names] if constrained else None,
                stops=stops,
                pad=stops[-1],
                engines=engines,
                loop=loop,
            )
            methods = CONSTRAINED if constrained else UNCONSTRAINED
            runs: dict[str, list[tuple[int, float]]] = {m: [] for m in methods}
            for k in range(args.warmup + args.iters):
                order = methods[k % len(methods) :] + methods[: k % len(methods)]
                for m in order:
                    got, dt = work.call(m, k)
                    print(f"  {mode:>13} {m:<14} {got:>6} tokens {dt:7.2f} s", flush=True)
                    if k >= args.warmup:
                        runs[m].append((got, dt))
            records += _records(args, mode, runs)
    finally:
        loop.run_until_complete(engines.close())
        loop.close()
    return records


def _records(args, mode: str, runs: dict[str, list[tuple[int, float]]]) -> list[Record]:
    env = environment()
    rate = {m: float(np.median([t / s for t, s in r])) for m, r in runs.items()}
    out = []
    for m, r in runs.items():
        secs = np.array([s for _, s in r]) * 1e6
        out.append(
            Record(
                bench="throughput",
                device=args.device,
                vocab="qwen3",
                vocab_rows=151936,
                batch_size=1 if m.endswith("_one") else args.batch_size,
                method=m,
                median_us=round(float(np.median(secs)), 1),
                p90_us=round(float(np.percentile(secs, 90)), 1),
                per_row_median_us=0.0,
                per_row_p90_us=0.0,
                iters=len(r),
                warmup=args.warmup,
                seed=args.seed,
                grammars=list(args.grammars) if mode == "constrained" else [],
                ratio=round(rate["engine"] / rate[m], 3) if m != "engine" else None,
                extra={
                    "mode": mode,
                    "model": args.model,
                    "tokens_per_s": round(rate[m], 1),
                    "tokens": [t for t, _ in r],
                    "requests": (
                        max(2, args.batch_size // 8) if m.endswith("_one") else args.requests
                    ),
                    "new_tokens": args.new_tokens,
                    "prompt_tokens": [args.min_prompt, args.max_prompt],
                    "loadavg_1m": round(os.getloadavg()[0], 2),
                },
                env=env,
            )
        )
    return out


def table(records: list[Record]) -> str:
    head = f"{'mode':>13}  {'method':<14}{'batch':>6}{'tok/s':>9}{'run p50':>10}{'engine x':>10}"
    lines = [head, "-" * len(head)]
    for r in records:
        x = r.extra
        ratio = f"{r.ratio:>9.2f}x" if r.ratio is not None else f"{'-':>10}"
        lines.append(
            f"{x['mode']:>13}  {r.method:<14}{r.batch_size:>6}{x['tokens_per_s']:>9.1f}"
            f"{r.median_us / 1e6:>8.2f} s{ratio}"
        )
    return "\n".join(lines)


def plot(records: list[Record], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r.extra["mode"] for r in records))
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        mine = [r for r in records if r.extra["mode"] == mode]
        vals = [r.extra["tokens_per_s"] for r in mine]
        colors = ["C0" if r.method.startswith("engine") else "C1" for r in mine]
        ax.bar([f"{r.method}\n(batch {r.batch_size})" for r in mine], vals, color=colors)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_title(mode, fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    axes[0][0].set_ylabel("tokens per second (median)")
    fig.suptitle(
        f"bench throughput — {records[0].device}, {Path(records[0].extra['model']).name}",
        fontsize=10,
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
