"""``thinkgate bench startup``: how long a spawned engine takes to answer, and where
its start-up time goes.

- **spawn**: ``EngineClient.spawn`` of the random model on a bundled vocabulary, then
  one plain request (5 tokens) and one JSON-schema request (the first grammar: it
  waits for a compile worker), each timed from the spawn; repeated ``--iters`` times.
- **phases**: in a fresh process, each start-up step alone, wall and CPU time: the
  imports the handshake needs, the tokenizer, then what the core needs (torch,
  xgrammar with transformers, the random model, ``TokenizerInfo``, the guard table)
  and a compile worker's own start (xgrammar without transformers, its
  ``TokenizerInfo``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .common import Record, environment

#: run in a fresh interpreter: each phase's wall and CPU time, as JSON on stdout
_PHASES = r"""
import json, sys, time
t, c = time.perf_counter(), time.process_time()
out = []
def lap(name):
    global t, c
    t2, c2 = time.perf_counter(), time.process_time()
    out.append((name, t2 - t, c2 - c))
    t, c = time.perf_counter(), time.process_time()
import engine_core.config, ipc, reasoning, tokenization, zmq
lap("imports before the handshake (ipc, zmq, msgspec, reasoning, tokenization)")
from tokenization import load_tokenizer
tok = load_tokenizer("qwen3")
lap("tokenizer qwen3 (quicktok)")
import torch
lap("import torch")
import xgrammar
lap("import xgrammar (and transformers)")
from engine_core.runners import RunnerOptions, create_runner
create_runner("random", tok, RunnerOptions(device="cpu", seed=0, max_num_seqs=256))
lap("random model")
from structured_output.vocab import tokenizer_info_for
tokenizer_info_for(tok)
lap("TokenizerInfo (background)")
from structured_output.guard import GuardTable
GuardTable(tok.all_token_bytes, tok.vocab_rows, special_ids=tok.special_ids, limit=16)
lap("guard table (background)")
print(json.dumps(out))
"""

_WORKER = r"""
import json, sys, time
t, c = time.perf_counter(), time.process_time()
from structured_output.compile_worker import _import_xgrammar
_import_xgrammar()
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps([("compile worker: import xgrammar without transformers", t2 - t, c2 - c)]))
"""


def _spawn_once() -> dict[str, float]:
    from engine_core.client import EngineClient
    from engine_core.config import EngineConfig
    from ipc import EngineCoreRequest, SamplingParams, StructuredOutputSpec

    async def body() -> dict[str, float]:
        t0 = time.perf_counter()
        client = await EngineClient.spawn(EngineConfig(model="random", log_level="WARNING"))
        out = {"handshake": time.perf_counter() - t0}
        try:
            plain = EngineCoreRequest("plain", [1, 2, 3], SamplingParams(max_tokens=5, seed=1))
            async for _ in client.generate(plain):
                pass
            out["first plain request done"] = time.perf_counter() - t0
            spec = StructuredOutputSpec("json_schema", '{"type": "object"}')
            req = EngineCoreRequest("json", [1, 2, 3], SamplingParams(max_tokens=8, seed=1), spec)
            async for _ in client.generate(req):
                pass
            out["first JSON request done"] = time.perf_counter() - t0
        finally:
            await client.shutdown()
        return out

    return asyncio.run(body())


def _phases() -> list[tuple[str, float, float]]:
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rows: list[tuple[str, float, float]] = []
    for script in (_PHASES, _WORKER):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
        )
        rows += [tuple(r) for r in json.loads(done.stdout.strip().splitlines()[-1])]
    return rows


def run(args: argparse.Namespace) -> list[Record]:
    env = environment()
    records = []

    def record(what: str, seconds: list[float], cpu: float | None = None) -> Record:
        med = sorted(seconds)[len(seconds) // 2]
        extra = {"what": what, "seconds": [round(s, 3) for s in seconds]}
        if cpu is not None:
            extra["cpu_s"] = round(cpu, 3)
        return Record(
            bench="startup",
            device="cpu",
            vocab="qwen3",
            vocab_rows=151936,
            batch_size=0,
            method=what,
            median_us=round(med * 1e6, 1),
            p90_us=round(max(seconds) * 1e6, 1),
            per_row_median_us=0.0,
            per_row_p90_us=0.0,
            iters=len(seconds),
            warmup=0,
            seed=args.seed,
            grammars=[],
            extra=extra,
            env=env,
        )

    spawns = [_spawn_once() for _ in range(max(1, args.iters))]
    for what in spawns[0]:
        records.append(record(what, [s[what] for s in spawns]))
    for what, wall, cpu in _phases():
        records.append(record(f"phase: {what}", [wall], cpu))
    return records


def table(records: list[Record]) -> str:
    lines = [f"{'':<78}{'wall (s)':>9}{'cpu (s)':>9}", "-" * 96]
    for r in records:
        cpu = r.extra.get("cpu_s")
        lines.append(
            f"{r.method:<78}{r.median_us / 1e6:>9.2f}{'' if cpu is None else f'{cpu:>9.2f}'}"
        )
    return "\n".join(lines)
