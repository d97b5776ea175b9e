"""thinkgate bench http: the HTTP server around the engine.

It starts ``thinkgate serve --model random`` (no forward cost beyond producing the
logits) on a free loopback port and sends, for each ``--concurrency`` C, ``--requests``
requests with C in flight at a time (after ``--warmup`` untimed ones):

- ``chat_1_token``: whole chat completions of one token (the cost of the server, the
  front end and one engine step);
- ``stream_N_tokens``: streamed chat completions of ``--stream-tokens`` tokens
  (``ignore_eos``), timed to their ``data: [DONE]``.

Per setting: requests per second (requests done over the wall time), and the median,
p90 and p99 of the requests' latencies. The load generator (httpx) runs in this
process, on the same cores as the server and the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .common import Record, environment

MESSAGES = [{"role": "user", "content": "Hi there, how are you?"}]


class _Server:
    """``thinkgate serve`` with the random model, until `close`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._log = tempfile.TemporaryFile(mode="w+")
        cmd = [
            sys.executable, "-m", "thinkgate", "serve", "--model", "random",
            "--tokenizer", "qwen3", "--device", args.device, "--seed", str(args.seed),
            "--max-num-seqs", str(max(64, *args.concurrency)), "--port", "0",
            "--compile-workers", str(args.compile_workers),
        ]  # fmt: skip
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("thinkgate serving on "):
                self.url = line.split()[-1]
                return
        self._log.seek(0)
        raise RuntimeError(f"thinkgate serve did not start:\n{self._log.read()}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


async def _chat_1_token(client, url: str, i: int) -> float:
    body = {"messages": MESSAGES, "max_tokens": 1, "seed": i}
    t0 = time.perf_counter()
    r = await client.post(url + "/v1/chat/completions", json=body)
    r.raise_for_status()
    assert r.json()["usage"]["completion_tokens"] == 1
    return time.perf_counter() - t0


def _streamed(tokens: int):
    async def one(client, url: str, i: int) -> float:
        body = {
            "messages": MESSAGES,
            "max_tokens": tokens,
            "seed": i,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        last = ""
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line:
                    last = line
        assert last == "data: [DONE]", last
        return time.perf_counter() - t0

    return one


async def _setting(client, url: str, fn, n: int, warmup: int, concurrency: int):
    sem = asyncio.Semaphore(concurrency)

    async def bounded(i: int) -> float:
        async with sem:
            return await fn(client, url, i)

    await asyncio.gather(*(bounded(n + i) for i in range(warmup)))
    t0 = time.perf_counter()
    times = await asyncio.gather(*(bounded(i) for i in range(n)))
    return np.asarray(times), time.perf_counter() - t0


def run(args: argparse.Namespace) -> list[Record]:
    import httpx

    env = environment()
    server = _Server(args)
    modes = [("chat_1_token", _chat_1_token), (f"stream_{args.stream_tokens}_tokens", None)]
    records: list[Record] = []

    async def body() -> None:
        limits = httpx.Limits(max_connections=max(args.concurrency) + 8)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            for mode, fn in modes:
                fn = fn or _streamed(args.stream_tokens)
                for c in args.concurrency:
                    times, wall = await _setting(
                        client, server.url, fn, args.requests, args.warmup, c
                    )
                    rec = _record(args, env, mode, c, times, wall)
                    records.append(rec)
                    print(
                        f"  {mode:<18} concurrency {c:>3}: {rec.extra['requests_per_s']:8.1f} "
                        f"req/s, p50 {rec.median_us / 1e3:8.1f} ms, "
                        f"p99 {rec.extra['p99_us'] / 1e3:8.1f} ms",
                        flush=True,
                    )

    try:
        asyncio.run(body())
    finally:
        server.close()
    return records


def _record(args, env, mode: str, c: int, seconds: np.ndarray, wall: float) -> Record:
    us = seconds * 1e6
    return Record(
        bench="http",
        device=args.device,
        vocab="qwen3",
        vocab_rows=151_936,
        batch_size=c,
        method=mode,
        median_us=float(np.median(us)),
        p90_us=float(np.percentile(us, 90)),
        per_row_median_us=float(np.median(us)),
        per_row_p90_us=float(np.percentile(us, 90)),
        iters=len(us),
        warmup=args.warmup,
        seed=args.seed,
        grammars=[],
        extra={
            "concurrency": c,
            "requests_per_s": round(len(us) / wall, 2),
            "p99_us": float(np.percentile(us, 99)),
            "wall_s": round(wall, 3),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        },
        env=env,
    )


def table(records: list[Record]) -> str:
    lines = [f"{'mode':<20} {'in flight':>9} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9}"]
    for r in records:
        lines.append(
            f"{r.method:<20} {r.batch_size:>9} {r.extra['requests_per_s']:>9.1f} "
            f"{r.median_us / 1e3:>9.1f} {r.extra['p99_us'] / 1e3:>9.1f}"
        )
    return "\n".join(lines)


def plot(records: list[Record], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{r.method}\n{r.batch_size} in flight" for r in records]
    a.bar(labels, [r.extra["requests_per_s"] for r in records], color="C0")
    a.set_ylabel("requests per second")
    b.bar(labels, [r.median_us / 1e3 for r in records], color="C0", label="p50")
    b.scatter(labels, [r.extra["p99_us"] / 1e3 for r in records], color="C3", marker="_", s=400,
              label="p99")  # fmt: skip
    b.set_ylabel("latency, ms")
    b.legend(fontsize=8)
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"bench http — {records[0].device}, random model, qwen3 vocabulary")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
