"""End to end: the engine process with the random model, a full batch, and several
request mixes.

One engine process (`bench.engine_probe`: the ordinary server, with timers around the
phases of its step) runs the random-logits model with a fixed forward cost
(``--forward-ms``) and the qwen3 reasoning parser, on the qwen3 vocabulary. The client
connects to it and, per mix, keeps ``batch + batch/32`` requests in flight (a request
that finishes is replaced at once, so the batch stays full and a few wait), lets the
engine run ``--warmup`` steps, then measures ``--iters`` steps.

A mix is a fraction of constrained requests (their grammars in turn from the bench
mix; the builtin JSON grammar is asked for as ``json_object``, the engine's JSON mode)
and whether half of the requests think. Thinking requests end their prompt with
``<think>\\n`` (as Qwen3.5 templates do): the qwen3 parser sees the thought open, so
they think from their first token, and the random model rarely writes ``</think>``, so
they go on thinking through the window. The others end their prompt with
``<think>\\n\\n</think>\\n\\n`` (thinking switched off): they answer at once, under their
grammar if they have one. Both halves are split evenly between constrained and not.
Unconstrained requests set ``ignore_eos`` and a large ``max_tokens`` so they last.

Step time is measured inside the engine process, around ``EngineCore.step``. The
structured-output overhead of a mix is its median step time minus that of the
unconstrained mix with the same thinking split, over its median step time. The probe's
phases say where the time goes: ``prepare`` (guides fed, masks filled; overlapped with
the forward pass), ``wait`` (blocked on the forward pass after that), ``sample``
(masks applied, tokens drawn), ``other`` (scheduling, outputs).
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

from . import states
from .common import Record, environment

_ROOT = str(Path(__file__).resolve().parent.parent)
PHASES = ("prepare", "forward", "wait", "sample", "other")


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
    tag = f"c{constrained:g}-t{int(thinking)}"
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
        while (await client.health()).num_running < b:
            await asyncio.sleep(0.05)
            _raise_failed(tasks)
        start = (await client.health()).num_steps + args.warmup
        while (h := await client.health()).num_steps < start + args.iters:
            await asyncio.sleep(0.1)
            _raise_failed(tasks)
        end = h.num_steps
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    while (h := await client.health()).num_running or h.num_waiting:
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


async def _run(args: argparse.Namespace, probe_out: Path) -> list[tuple[float, bool, int, int]]:
    config = EngineConfig(
        model="random",
        tokenizer="qwen3",
        reasoning_parser="qwen3",
        device=args.device,
        max_num_seqs=args.batch_size,
        runner_options={"forward_ms": args.forward_ms},
        seed=args.seed,
        log_level="WARNING",
    )
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
    for c, thinking, sel, ph in stats:
        med = float(np.median(ph["step"]))
        overhead = (med - base[thinking]) / med if thinking in base else None
        b = args.batch_size
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
                    "constrained_fraction": c,
                    "thinking_fraction": 0.5 if thinking else 0.0,
                    "forward_ms": args.forward_ms,
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
        f"{'constrained':>11}{'thinking':>9}{'rows':>7}{'masked':>7}{'think':>6}"
        f"{'step p50':>11}{'p90':>10}" + "".join(f"{p:>10}" for p in PHASES) + f"{'overhead':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        x = r.extra
        ph = x["phase_median_us"]
        ov = x["so_overhead"]
        lines.append(
            f"{x['constrained_fraction']:>11.0%}{x['thinking_fraction']:>9.0%}{x['mean_rows']:>7.0f}"
            f"{x['mean_masked_rows']:>7.0f}{x['mean_thinking_rows']:>6.0f}"
            f"{r.median_us / 1e3:>8.1f} ms{r.p90_us / 1e3:>7.1f} ms"
            + "".join(f"{ph[p] / 1e3:>7.1f} ms" for p in PHASES)
            + (f"{ov:>10.1%}" if ov is not None else f"{'-':>10}")
        )
    return "\n".join(lines)


def plot(records: list[Record], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels, bottom = [], np.zeros(len(records))
    for r in records:
        x = r.extra
        labels.append(
            f"{x['constrained_fraction']:.0%} constr.\n{x['thinking_fraction']:.0%} think"
        )
    for i, p in enumerate(("prepare", "wait", "sample", "other")):
        vals = np.array([max(0.0, r.extra["phase_median_us"][p]) / 1e3 for r in records])
        ax.bar(labels, vals, bottom=bottom, color=f"C{i}", label=p)
        bottom += vals
    for i, r in enumerate(records):
        ov = r.extra["so_overhead"]
        note = f"{r.median_us / 1e3:.1f} ms" + ("" if ov is None else f"\n{ov:+.1%}")
        ax.text(i, bottom[i], note, ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("median per step (ms); phases are medians")
    ax.set_title(
        f"bench e2e — {records[0].device}, batch {records[0].batch_size}, "
        f"forward {records[0].extra['forward_ms']:g} ms (label: step p50, overhead)"
    )
    ax.legend(fontsize=8)
    ax.set_ylim(0, bottom.max() * 1.25)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
