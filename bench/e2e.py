"""End to end: the engine process with a full batch, and several request mixes.

One engine process (`bench.engine_probe`: the ordinary server, with timers around the
phases of its step) runs, per batch size, either the random-logits model with a fixed
forward cost (``--forward-ms``) or, with ``--model DIR``, a real model directory through
the batched runner (a real forward pass; ``thinkgate make-model`` writes a small one),
with the qwen3 reasoning parser. The client connects to it and, per mix, keeps
``batch + batch/32`` requests in flight (a request that finishes is replaced at once, so
the batch stays full and a few wait), lets the engine run ``--warmup`` steps, then
measures ``--iters`` steps.

A mix is a fraction of constrained requests (their grammars in turn from the bench
mix: JSON schemas, a forced hermes tool call; the builtin JSON grammar is asked for as
``json_object``, the engine's JSON mode) and whether half of the requests think.
Thinking requests end their prompt with ``<think>\\n`` (as Qwen3.5 templates do): the
qwen3 parser sees the thought open, so they think from their first token, and the
models rarely write ``</think>``, so they go on thinking through the window. The others
end their prompt with ``<think>\\n\\n</think>\\n\\n`` (thinking switched off): they
answer at once, under their grammar if they have one. Both halves are split evenly
between constrained and not. Unconstrained requests set ``ignore_eos`` and
``--max-tokens`` so they last.

Step time is measured inside the engine process, around ``EngineCore.step``; tokens per
second are the tokens sampled over the window's steps over their time. The probe's
phases say where the time goes: ``prepare`` (guides fed, masks filled; overlapped with
the forward pass), ``forward`` (on the model thread), ``wait`` (blocked on the forward
pass after ``prepare``), ``sample`` (masks applied, tokens drawn), ``other``
(scheduling, outputs). Two measures of what structured output costs:

- ``so_share``: the structured-output work that lengthens the step, over the step: the
  part of ``prepare`` that outlasted the forward pass (zero when the fill is hidden
  behind it; ``fill_hidden`` is the fraction of steps where it was) plus the time the
  sampler spends on masks (turning them into allowed ids, applying them);
- ``so_overhead``: the mix's median step minus that of the unconstrained mix with the
  same thinking split, over its median step (negative where a constrained row that
  allows few tokens is sampled from those alone, cheaper than a full-vocabulary draw).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from engine_core.client import EngineClient
from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, SamplingParams, StructuredOutputSpec, private_ipc_address
from structured_output.config import StructuredOutputConfig

from . import states
from .common import Record, environment
from .engine_probe import MASK_WORK

_ROOT = str(Path(__file__).resolve().parent.parent)
PHASES = ("prepare", "forward", "wait", "sample", "other")

#: batch sizes measured with ``--model`` unless ``--batch-sizes`` says otherwise
MODEL_BATCH_SIZES = [1, 32, 128, 256]


def _spec(grammar: str) -> StructuredOutputSpec:
    if grammar == "builtin_json":
        return StructuredOutputSpec("json_object")
    s = states.SPECS[grammar]
    return StructuredOutputSpec(s.kind.value, s.value)


def slot_kinds(n: int, constrained: float, thinking: bool) -> list[tuple[bool, bool]]:
    """(constrained, thinking) of each of ``n`` slots: constrained slots evenly spread;
    with ``thinking``, every other slot of each kind thinks."""
    kinds = []
    seen = {True: 0, False: 0}
    for i in range(n):
        c = int((i + 1) * constrained) > int(i * constrained)
        kinds.append((c, thinking and seen[c] % 2 == 1))
        seen[c] += 1
    return kinds


async def _measure_mix(
    client: EngineClient,
    args: argparse.Namespace,
    constrained: float,
    thinking: bool,
    prompts: dict[bool, list[int]],
) -> tuple[int, int]:
    """Run one mix; return the engine's step numbers [start, end) of its window."""
    b = args.batch_size
    kinds = slot_kinds(b + max(1, b // 32), constrained, thinking)
    tag = f"b{b}-c{constrained:g}-t{int(thinking)}"
    grammars = iter(range(len(kinds)))

    async def slot(i: int, c: bool, think: bool) -> None:
        spec = _spec(args.grammars[next(grammars) % len(args.grammars)]) if c else None
        k = 0
        while True:
            req = EngineCoreRequest(
                f"{tag}-{i}-{k}",
                prompts[think],
                SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=not c),
                structured_output=spec,
                reasoning_ended=not think,
            )
            async for out in client.generate(req):
                if out.finished and out.error:
                    raise RuntimeError(f"e2e: request {req.request_id} failed: {out.error}")
            k += 1

    tasks = [asyncio.create_task(slot(i, c, t)) for i, (c, t) in enumerate(kinds)]
    try:
        while (await client.health(timeout_s=120)).num_running < b:
            await asyncio.sleep(0.05)
            _raise_failed(tasks)
        start = (await client.health(timeout_s=120)).num_steps + args.warmup
        while (h := await client.health(timeout_s=120)).num_steps < start + args.iters:
            await asyncio.sleep(0.1)
            _raise_failed(tasks)
        end = h.num_steps
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    while (h := await client.health(timeout_s=120)).num_running or h.num_waiting:
        await asyncio.sleep(0.05)
    return start, end


async def _compile_first(client: EngineClient, args: argparse.Namespace, prompt: list[int]) -> None:
    """One short request per grammar, so that every grammar is compiled (and cached)
    before any window: compile time is not what this bench measures. (It also keeps
    clear of an engine bug: aborting a request whose grammar is still compiling cancels
    the compile future that other requests of the same spec share.)"""

    async def one(g: str) -> None:
        req = EngineCoreRequest(
            f"compile-{g}",
            prompt,
            SamplingParams(max_tokens=1),
            structured_output=_spec(g),
            reasoning_ended=True,
        )
        async for out in client.generate(req):
            if out.finished and out.error:
                raise RuntimeError(f"e2e: grammar {g} failed: {out.error}")

    await asyncio.gather(*(one(g) for g in args.grammars))


def _raise_failed(tasks: list[asyncio.Task]) -> None:
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


def engine_config(args: argparse.Namespace, batch: int) -> EngineConfig:
    if args.model is None:
        return EngineConfig(
            model="random",
            tokenizer="qwen3",
            reasoning_parser="qwen3",
            device=args.device,
            max_num_seqs=batch,
            runner_options={"forward_ms": args.forward_ms},
            seed=args.seed,
            log_level="WARNING",
            structured_output=StructuredOutputConfig(compile_workers=args.compile_workers),
        )
    own = Path(args.model, "tokenizer.json").is_file()
    return EngineConfig(
        model=args.model,
        tokenizer=None if own else "qwen3",
        reasoning_parser="qwen3",
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=batch,
        max_num_batched_tokens=max(2048, batch),
        seed=args.seed,
        log_level="WARNING",
        structured_output=StructuredOutputConfig(compile_workers=args.compile_workers),
    )


async def _run(args: argparse.Namespace, probe_out: Path) -> list[tuple[float, bool, int, int]]:
    config = engine_config(args, args.batch_size)
    address, own_dir = private_ipc_address()
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proto = []
    if args.engine_torch_threads:
        proto += ["--torch-threads", str(args.engine_torch_threads)]
    cmd = [
        sys.executable,
        "-m",
        "bench.engine_probe",
        "--probe-out",
        str(probe_out),
        *proto,
        *config.to_args(),
        "--address",
        address,
        "--parent-pid",
        str(os.getpid()),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    windows = []
    try:
        client = await EngineClient.connect(address, timeout_s=300)
        tok = client.tokenizer()
        head = "<|im_start|>user\nCall one of the tools.<|im_end|>\n<|im_start|>assistant\n"
        prompts = {
            True: tok.encode(head + "<think>\n"),
            False: tok.encode(head + "<think>\n\n</think>\n\n"),
        }
        try:
            await _compile_first(client, args, prompts[False])
            for thinking in args.thinking:
                for c in args.constrained:
                    print(
                        f"  e2e mix: {c:.0%} constrained, "
                        f"{'half' if thinking else 'none'} thinking",
                        flush=True,
                    )
                    windows.append(
                        (c, thinking, *await _measure_mix(client, args, c, thinking, prompts))
                    )
        finally:
            await client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(own_dir, ignore_errors=True)
    return windows


def run(args: argparse.Namespace) -> list[Record]:
    sizes = args.batch_sizes or (MODEL_BATCH_SIZES if args.model else [256])
    if args.max_tokens is None:  # a real model's attention grows with the length
        args.max_tokens = 384 if args.model else 4096
    records = []
    for b in sizes:
        print(f"  e2e batch {b}", flush=True)
        records += _run_size(argparse.Namespace(**{**vars(args), "batch_size": b}))
    return records


def _run_size(args: argparse.Namespace) -> list[Record]:
    tmp = Path(tempfile.mkdtemp(prefix="thinkgate-e2e-"))
    try:
        windows = asyncio.run(_run(args, tmp / "probe.json"))
        probe = {k: np.asarray(v) for k, v in json.loads((tmp / "probe.json").read_text()).items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    env = environment()
    steps = np.arange(1, len(probe["step"]) + 1)  # the engine's num_steps after each step
    stats = []
    for c, thinking, start, end in windows:
        sel = (steps > start) & (steps <= end)
        ph = {k: probe[k][sel] * 1e6 for k in ("step", "prepare", "forward", "wait", "sample")}
        ph["other"] = ph["step"] - ph["prepare"] - ph["wait"] - ph["sample"]
        stats.append((c, thinking, sel, ph))
    base = {t: float(np.median(ph["step"])) for c, t, _, ph in stats if c == 0}
    records = []
    b = args.batch_size
    for c, thinking, sel, ph in stats:
        med = float(np.median(ph["step"]))
        overhead = (med - base[thinking]) / med if thinking in base else None
        exposed, apply = probe["exposed"][sel], probe["apply"][sel]
        total = float(probe["step"][sel].sum())
        masked = probe["masked"][sel] > 0
        records.append(
            Record(
                bench="e2e",
                device=args.device,
                vocab="qwen3",
                vocab_rows=151936,
                batch_size=b,
                method="baseline" if c == 0 else "engine",
                median_us=round(med, 1),
                p90_us=round(float(np.percentile(ph["step"], 90)), 1),
                per_row_median_us=round(med / b, 2),
                per_row_p90_us=round(float(np.percentile(ph["step"], 90)) / b, 2),
                iters=int(sel.sum()),
                warmup=args.warmup,
                seed=args.seed,
                grammars=list(args.grammars),
                extra={
                    "model": args.model or "random",
                    "constrained_fraction": c,
                    "thinking_fraction": 0.5 if thinking else 0.0,
                    "forward_ms": None if args.model else args.forward_ms,
                    "tokens_per_s": round(float(probe["ready"][sel].sum()) / total, 1),
                    "so_share": round((float(exposed.sum()) + float(apply.sum())) / total, 4),
                    "fill_hidden": (
                        round(float((exposed[masked] == 0).mean()), 3) if masked.any() else None
                    ),
                    "exposed_fill_median_us": round(float(np.median(exposed)) * 1e6, 1),
                    "apply_median_us": round(float(np.median(apply)) * 1e6, 1),
                    "mask_work_median_us": {
                        name: round(float(np.median(probe[f"apply_{name}"][sel])) * 1e6, 1)
                        for name in MASK_WORK
                    },
                    "so_overhead": None if overhead is None else round(overhead, 4),
                    "phase_median_us": {k: round(float(np.median(v)), 1) for k, v in ph.items()},
                    "mean_rows": round(float(probe["rows"][sel].mean()), 1),
                    "full_batch_steps": round(float((probe["rows"][sel] == b).mean()), 3),
                    "mean_masked_rows": round(float(probe["masked"][sel].mean()), 1),
                    "mean_thinking_rows": round(float(probe["thinking"][sel].mean()), 1),
                    "loadavg_1m": round(os.getloadavg()[0], 2),
                    "engine_torch_threads": args.engine_torch_threads,
                },
                env=env,
            )
        )
    return records


def table(records: list[Record]) -> str:
    head = (
        f"{'batch':>5}{'constr.':>8}{'think':>6}{'rows':>6}{'masked':>7}"
        f"{'step p50':>11}{'p90':>10}"
        + "".join(f"{p:>10}" for p in PHASES)
        + f"{'tok/s':>8}{'SO share':>9}{'hidden':>7}{'overhead':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        x = r.extra
        ph = x["phase_median_us"]
        ov, hid = x["so_overhead"], x["fill_hidden"]
        lines.append(
            f"{r.batch_size:>5}{x['constrained_fraction']:>8.0%}{x['thinking_fraction']:>6.0%}"
            f"{x['mean_rows']:>6.0f}{x['mean_masked_rows']:>7.0f}"
            f"{r.median_us / 1e3:>8.1f} ms{r.p90_us / 1e3:>7.1f} ms"
            + "".join(f"{ph[p] / 1e3:>7.1f} ms" for p in PHASES)
            + f"{x['tokens_per_s']:>8.0f}{x['so_share']:>9.1%}"
            + (f"{hid:>7.0%}" if hid is not None else f"{'-':>7}")
            + (f"{ov:>9.1%}" if ov is not None else f"{'-':>9}")
        )
    return "\n".join(lines)


def plot(records: list[Record], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.batch_size for r in records})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 + 4 * len(sizes), 4.5), squeeze=False)
    for ax, b in zip(axes[0], sizes, strict=True):
        mine = [r for r in records if r.batch_size == b]
        labels = [
            f"{x['constrained_fraction']:.0%} constr.\n{x['thinking_fraction']:.0%} think"
            for x in (r.extra for r in mine)
        ]
        bottom = np.zeros(len(mine))
        for i, p in enumerate(("prepare", "wait", "sample", "other")):
            vals = np.array([max(0.0, r.extra["phase_median_us"][p]) / 1e3 for r in mine])
            ax.bar(labels, vals, bottom=bottom, color=f"C{i}", label=p)
            bottom += vals
        for i, r in enumerate(mine):
            note = f"{r.median_us / 1e3:.1f} ms\nSO {r.extra['so_share']:.1%}"
            ax.text(i, bottom[i], note, ha="center", va="bottom", fontsize=7)
        ax.set_title(f"batch {b}", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylim(0, bottom.max() * 1.3)
    axes[0][0].set_ylabel("median per step (ms); phases are medians")
    axes[0][0].legend(fontsize=7)
    model = records[0].extra["model"]
    what = (
        f"forward {records[0].extra['forward_ms']:g} ms" if model == "random" else Path(model).name
    )
    fig.suptitle(
        f"bench e2e — {records[0].device}, {what} (label: step p50, structured-output share)",
        fontsize=10,
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
