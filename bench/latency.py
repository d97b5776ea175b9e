"""``thinkgate bench latency``: what the engine process costs around the model.

Two figures, through the real client and sockets, with the random model (no forward
cost beyond producing its logits):

- the round trip of a 1-token request: submit, one step, final output back (median
  and p90 of ``--requests`` requests sent one after another);
- engine steps per second with ``B`` requests in the batch, for each ``--batch-sizes``
  (requests that never stop; steps counted by the engine between two health replies
  ``--seconds`` apart).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import numpy as np

from engine_core.client import EngineClient
from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, SamplingParams
from structured_output.config import StructuredOutputConfig

from .common import Record, environment

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]


async def _round_trips(client: EngineClient, n: int) -> np.ndarray:
    times = []
    for i in range(n):
        req = EngineCoreRequest(f"rt{i}", PROMPT, SamplingParams(max_tokens=1, seed=i))
        t0 = time.perf_counter()
        async for out in client.generate(req):
            if out.finished:
                break
        times.append((time.perf_counter() - t0) * 1e6)
    return np.asarray(times)


async def _steps_per_second(client: EngineClient, batch: int, seconds: float) -> float:
    reqs = [
        EngineCoreRequest(
            f"st{batch}-{i}", PROMPT, SamplingParams(max_tokens=30_000, ignore_eos=True, seed=i)
        )
        for i in range(batch)
    ]

    async def drain(r: EngineCoreRequest) -> None:
        async for _ in client.generate(r):
            pass

    tasks = [asyncio.create_task(drain(r)) for r in reqs]
    while (await client.health()).num_running < batch:
        await asyncio.sleep(0.05)
    await asyncio.sleep(min(2.0, seconds))  # warm up
    a = await client.health()
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    b = await client.health()
    rate = (b.num_steps - a.num_steps) / (time.perf_counter() - t0)
    await client.abort([r.request_id for r in reqs])
    await asyncio.gather(*tasks)
    return rate


def run(args: argparse.Namespace) -> list[Record]:
    env = environment()
    config = EngineConfig(
        model="random",
        max_num_seqs=max(args.batch_sizes),
        device=args.device,
        seed=args.seed,
        log_level="WARNING",
        structured_output=StructuredOutputConfig(compile_workers=args.compile_workers),
    )

    async def body() -> list[Record]:
        client = await EngineClient.spawn(config)
        try:
            await _round_trips(client, args.warmup)
            rt = await _round_trips(client, args.requests)
            records = [
                _record(args, env, 1, rt, {"what": "round_trip_1_token", "requests": args.requests})
            ]
            print(
                f"  1-token round trip: median {np.median(rt):.0f} µs, "
                f"p90 {np.percentile(rt, 90):.0f} µs",
                flush=True,
            )
            for b in args.batch_sizes:
                rate = await _steps_per_second(client, b, args.seconds)
                step = np.asarray([1e6 / rate])
                print(f"  batch {b}: {rate:.1f} steps/s ({1e3 / rate:.1f} ms a step)", flush=True)
                records.append(
                    _record(args, env, b, step, {"what": "steps", "steps_per_s": round(rate, 2)})
                )
            return records
        finally:
            await client.shutdown()

    return asyncio.run(body())


def _record(args, env, batch: int, us: np.ndarray, extra: dict) -> Record:
    return Record(
        bench="latency",
        device=args.device,
        vocab="qwen3",
        vocab_rows=151_936,
        batch_size=batch,
        method="engine",
        median_us=float(np.median(us)),
        p90_us=float(np.percentile(us, 90)),
        per_row_median_us=float(np.median(us)) / batch,
        per_row_p90_us=float(np.percentile(us, 90)) / batch,
        iters=len(us),
        warmup=args.warmup,
        seed=args.seed,
        grammars=[],
        extra={**extra, "loadavg_1m": round(os.getloadavg()[0], 2)},
        env=env,
    )


def plot(records: list[Record], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        "1-token round trip"
        if r.extra["what"] == "round_trip_1_token"
        else f"step, batch {r.batch_size}"
        for r in records
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(labels, [r.median_us / 1e3 for r in records], color="C0", label="median")
    ax.scatter(
        labels, [r.p90_us / 1e3 for r in records], color="C3", marker="_", s=400, label="p90"
    )
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale)")
    ax.set_title(f"bench latency — {records[0].device}, random model, qwen3 vocabulary")
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
