"""``thinkgate bench startup``: how long a spawned engine takes to answer, how much
CPU its start costs, and where its start-up time goes.

- **spawn**: ``EngineClient.spawn`` of the random model on each of ``--vocabs``
  (default qwen3), then one plain request (5 tokens) and one JSON-schema request (the
  first grammar: it waits for a compile worker, and for the guard table), each timed
  from the spawn, with the CPU seconds of the engine's process tree (the engine and
  its compile workers) by then; repeated ``--iters`` times.
- **phases**: in a fresh process, each start-up step alone, wall and CPU time: the
  imports the handshake needs, the tokenizer, then what the core needs (torch,
  xgrammar as the engine imports it, without transformers, the random model,
  ``TokenizerInfo``, the guard table) and a compile worker's own start (xgrammar
  without transformers, its ``TokenizerInfo``).
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
tok = load_tokenizer(sys.argv[1])
lap(f"tokenizer {sys.argv[1]} (quicktok)")
import torch
lap("import torch")
from structured_output.xgrammar_import import import_xgrammar
import_xgrammar()
lap("import xgrammar (without transformers, as the engine does)")
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
from structured_output.xgrammar_import import import_xgrammar
import_xgrammar()
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps([("compile worker: import xgrammar without transformers", t2 - t, c2 - c)]))
"""


def _spawn_once(vocab: str, workers: int) -> dict[str, tuple[float, float | None]]:
    """Each milestone: seconds since the spawn, and the CPU seconds of the engine's
    process tree by then (None where ``/proc`` cannot tell)."""
    from engine_core.client import EngineClient
    from engine_core.config import EngineConfig
    from ipc import EngineCoreRequest, SamplingParams, StructuredOutputSpec
    from structured_output.config import StructuredOutputConfig

    async def body() -> dict[str, tuple[float, float | None]]:
        t0 = time.perf_counter()
        config = EngineConfig(
            model="random",
            tokenizer=vocab,
            log_level="WARNING",
            structured_output=StructuredOutputConfig(compile_workers=workers),
        )
        client = await EngineClient.spawn(config)
        pid = client.proc.pid if client.proc is not None else None
        out = {"handshake": (time.perf_counter() - t0, tree_cpu_s(pid))}
        try:
            plain = EngineCoreRequest("plain", [1, 2, 3], SamplingParams(max_tokens=5, seed=1))
            async for _ in client.generate(plain):
                pass
            out["first plain request done"] = (time.perf_counter() - t0, tree_cpu_s(pid))
            spec = StructuredOutputSpec("json_schema", '{"type": "object"}')
            req = EngineCoreRequest("json", [1, 2, 3], SamplingParams(max_tokens=8, seed=1), spec)
            async for _ in client.generate(req):
                pass
            out["first JSON request done"] = (time.perf_counter() - t0, tree_cpu_s(pid))
        finally:
            await client.shutdown()
        return out

    return asyncio.run(body())


def tree_cpu_s(pid: int | None) -> float | None:
    """User and system CPU seconds of process ``pid`` and its live descendants (Linux
    ``/proc``; None elsewhere)."""
    if pid is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        cpu[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    if pid not in cpu:
        return None
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo += children.get(p, [])
    return total


def _phases(vocab: str) -> list[tuple[str, float, float]]:
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rows: list[tuple[str, float, float]] = []
    for script in (_PHASES, _WORKER):
        done = subprocess.run(
            [sys.executable, "-c", script, vocab],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        rows += [tuple(r) for r in json.loads(done.stdout.strip().splitlines()[-1])]
    return rows


def run(args: argparse.Namespace) -> list[Record]:
    from tokenization import BUNDLED

    env = environment()
    records = []

    def record(vocab: str, what: str, seconds: list[float], cpu: list[float | None]) -> Record:
        med = sorted(seconds)[len(seconds) // 2]
        extra: dict = {"what": what, "seconds": [round(s, 3) for s in seconds]}
        known = sorted(c for c in cpu if c is not None)
        if known:
            extra["cpu_s"] = round(known[len(known) // 2], 3)
            extra["cpu_s_each"] = [round(c, 3) for c in known]
        return Record(
            bench="startup",
            device="cpu",
            vocab=vocab,
            vocab_rows=BUNDLED[vocab].vocab_rows,
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

    for vocab in args.vocabs:
        spawns = [_spawn_once(vocab, args.compile_workers) for _ in range(max(1, args.iters))]
        for what in spawns[0]:
            got = [s[what] for s in spawns]
            records.append(record(vocab, what, [w for w, _ in got], [c for _, c in got]))
        for what, wall, cpu in _phases(vocab):
            records.append(record(vocab, f"phase: {what}", [wall], [cpu]))
    return records


def table(records: list[Record]) -> str:
    lines = [f"{'':<94}{'wall (s)':>9}{'cpu (s)':>9}", "-" * 112]
    for r in records:
        cpu = r.extra.get("cpu_s")
        lines.append(
            f"{r.vocab:<16}{r.method:<78}{r.median_us / 1e6:>9.2f}"
            f"{'' if cpu is None else f'{cpu:>9.2f}'}"
        )
    return "\n".join(lines)
