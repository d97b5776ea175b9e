"""``thinkgate bench fill --peer-python PATH``: the engine's fill side by side with
vLLM's own ``StructuredOutputManager.grammar_bitmask``.

vLLM runs in its own venv (``PATH`` is that venv's python; see bench/README.md), as a
subprocess driven over a pipe by `bench.peer_vllm`. Both sides get the same four JSON
schemas, the same vocabulary (Qwen3, 151,936 rows; the peer's tokenizer folder is
built from the same ranks) and the same states: row ``i`` takes schema ``i % 4`` and a
random valid document for it, tokenized here, and both sides accept the same random
prefix of those token ids. Then, in rounds, each batch size is timed on each side in
turn (the order alternating between rounds, never both at once): vLLM's
``grammar_bitmask`` over the first B requests, step after step, and the engine's
`BitmaskFiller` as configured (its default batch threshold and threads, the guard on
with the default whitespace bound) over the same B states, step after step too: that
pair gives the ratio to vLLM. Then the engine's own ratios, its steps interleaved with
those of the engine with the bound off (the guard keeps UTF-8, escapes and control
characters only: what the bound costs is engine over this) and of the filler with no
guard at all.

Checked before timing: at the largest batch, the engine's masks with the guard off
equal vLLM's on every ordinary id (special tokens are sealed in the engine's
vocabulary), and the rows the guard changes are counted.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from structured_output import CompileOptions, GrammarSpec, LocalCompiler
from structured_output.bitmask import BitmaskFiller, fill_threads_for
from structured_output.config import StructuredOutputConfig
from structured_output.guide import RequestGuide
from tokenization import load_tokenizer

from . import states
from .common import (
    Method,
    Record,
    environment,
    helper_start_us,
    p50,
    p90,
    side_by_side,
    threads_line,
)
from .summary import one_row_line

_WORDS = ["alpha", "Zürich", "東京", "report", 'say "hi"', "a/b", "x", "", "2024-05-17", "🙂"]

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "email": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "age", "email", "tags"],
        "additionalProperties": False,
    },
    states.WEATHER,
    {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string"},
                        "qty": {"type": "integer"},
                        "price": {"type": "number"},
                    },
                    "required": ["sku", "qty", "price"],
                },
            },
            "total": {"type": "number"},
        },
        "required": ["order_id", "items", "total"],
    },
    {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "summary": {"type": "string"},
            "score": {"type": "number"},
            "meta": {
                "type": "object",
                "properties": {"lang": {"type": "string"}, "len": {"type": "integer"}},
                "required": ["lang", "len"],
            },
        },
        "required": ["title", "summary", "score", "meta"],
    },
]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, n)))


def document(rng: random.Random, k: int) -> str:
    """A random valid instance of ``SCHEMAS[k]``, compact, spaced or indented."""
    if k == 0:
        value: Any = {
            "name": _text(rng, 4),
            "age": rng.randint(0, 120),
            "email": f"user{rng.randint(0, 999)}@example.com",
            "tags": [_text(rng, 2) for _ in range(rng.randint(0, 6))],
        }
    elif k == 1:
        value = states._weather(rng)
    elif k == 2:
        value = {
            "order_id": f"ord-{rng.randint(0, 99999):05d}",
            "items": [
                {"sku": f"sku-{j}", "qty": rng.randint(1, 9), "price": round(rng.uniform(1, 99), 2)}
                for j in range(rng.randint(0, 5))
            ],
            "total": round(rng.uniform(0, 999), 2),
        }
    else:
        value = {
            "title": _text(rng, 5),
            "summary": _text(rng, 20),
            "score": round(rng.uniform(0, 1), 3),
            "meta": {"lang": rng.choice(["en", "de", "ja"]), "len": rng.randint(0, 9999)},
        }
    return states._dumps(rng, value)


class Peer:
    """vLLM's manager in its own venv, driven over a pipe (`bench.peer_vllm`)."""

    def __init__(self, python: str, log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        script = Path(__file__).with_name("peer_vllm.py")
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [python, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"the vLLM peer exited (code {code}); see {self._log.name}")
        return json.loads(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it has exited already
        self.proc.wait(timeout=30)
        self._log.close()


def _peer_tokenizer(python: str, given: str | None) -> str:
    if given:
        return given
    # PEER_DIR/venv/bin/python -> PEER_DIR/qwen3-tokenizer (the venv's python may be a
    # link to the system's: its own path is what names the venv)
    return str(Path(python).absolute().parent.parent.parent / "qwen3-tokenizer")


def run(args: argparse.Namespace) -> list[Record]:
    env = environment()
    start_delay = round(helper_start_us(), 1)
    tok = load_tokenizer("qwen3")
    biggest = max(args.batch_sizes)
    rng = random.Random(args.seed)
    rows: list[tuple[int, list[int]]] = []
    for i in range(biggest):
        k = i % len(SCHEMAS)
        ids = tok.encode(document(rng, k), special=False)
        rows.append((k, ids[: rng.randrange(len(ids))]))

    config = StructuredOutputConfig()

    def filler(guard: Any) -> BitmaskFiller:
        return BitmaskFiller(
            biggest,
            tok.vocab_rows,
            batch_threshold=config.fill_batch_threshold,
            max_threads=fill_threads_for(config.fill_threads),
            guard=guard,
        )

    guides: dict[str, list[RequestGuide]] = {}
    fillers: dict[str, BitmaskFiller] = {}
    bound = config.max_whitespace
    sides = (("engine", bound), ("bound_off", None), ("unguarded", bound))
    for name, limit in sides:  # each filler its own matchers (they keep string masks)
        local = LocalCompiler(tok, CompileOptions(max_whitespace=limit))
        grammars = [local.compile(GrammarSpec.of("json_schema", json.dumps(s))) for s in SCHEMAS]
        matchers = []
        for k, ids in rows:
            m = local.matcher(grammars[k])
            if not all(m.accept_token(t) for t in ids):
                raise AssertionError(f"the engine's grammar rejected a prefix of schema {k}")
            matchers.append(m)
        guides[name] = [RequestGuide(None, m) for m in matchers]
        fillers[name] = filler(local.guard if name != "unguarded" else None)

    # each state as a decode that wrote its prefix leaves it, put back before each step
    # (only the ``b`` rows timed: touching all of them would leave every step to start
    # from cold caches, as vLLM's never do)
    decoded = states.as_decoded(
        [[side[i].matcher for side in guides.values()] for i in range(biggest)],
        [ids for _, ids in rows],
    )

    def restore(b: int) -> Callable[[], None]:
        def run() -> None:
            for h in decoded[:b]:
                h()

        return run

    # the peer's log beside the results, else in the temporary folder (not the tree)
    out_dir = Path(args.json).parent if args.json else Path(tempfile.gettempdir())
    peer = Peer(args.peer_python, out_dir / "peer-vllm.log")
    try:
        info = peer.ask(
            cmd="setup",
            tokenizer=_peer_tokenizer(args.peer_python, args.peer_tokenizer),
            max_num_seqs=biggest,
            schemas=SCHEMAS,
            rows=rows,
        )
        print(f"peer: {info}", flush=True)
        if info["vocab_rows"] != tok.vocab_rows:
            raise AssertionError(f"vocabularies differ: {info['vocab_rows']} vs {tok.vocab_rows}")
        checks = _check(peer, fillers, guides["engine"], biggest, tok)
        print(f"masks: {checks}", flush=True)
        times: dict[int, dict[str, list[float]]] = {b: {} for b in args.batch_sizes}
        loads = []
        for rnd in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for b in args.batch_sizes:
                # vLLM in its process, then the engine's three fillers interleaved step
                # by step (or the other way round, by round): the engine's own ratios are
                # paired per step, the ratio to vLLM per round
                for part in ("vllm", "ours") if rnd % 2 == 0 else ("ours", "vllm"):
                    if part == "vllm":
                        got = peer.ask(cmd="time", batch=b, steps=args.iters)["times_us"]
                        times[b].setdefault("vllm", []).extend(got[args.warmup :])
                        continue
                    index = list(range(b))
                    fills = {
                        side: _fill(fillers[side], index, guides[side][:b])
                        for side in ("engine", "bound_off", "unguarded")
                    }
                    # the engine's steps one after another, as vLLM's run (for the ratio
                    # to vLLM); then its three fillers interleaved (for its own ratios)
                    alone = {"engine": fills["engine"]}
                    paired = {"engine_paired" if k == "engine" else k: f for k, f in fills.items()}
                    for methods in (alone, paired):
                        ours = side_by_side(
                            methods,
                            iters=args.iters - args.warmup,
                            warmup=args.warmup,
                            device="cpu",
                            between=restore(b),
                        )
                        for side, got in ours.items():
                            times[b].setdefault(side, []).extend(got.tolist())
        loads.append(os.getloadavg()[0])
        one_row = _one_row_states(args, peer, fillers["engine"], guides["engine"], decoded)
    finally:
        peer.close()

    names = ["person", "weather", "order", "article"]

    def record(b: int, method: str, t: np.ndarray, base: np.ndarray | None, **kw: Any) -> Record:
        return Record(
            bench="fill-vs-vllm",
            device="cpu",
            vocab="qwen3",
            vocab_rows=tok.vocab_rows,
            batch_size=b,
            method=method,
            median_us=round(p50(t), 1),
            p90_us=round(p90(t), 1),
            per_row_median_us=round(p50(t) / b, 2),
            per_row_p90_us=round(p90(t) / b, 2),
            iters=args.iters,
            warmup=args.warmup,
            seed=args.seed,
            ratio=round(p50(base) / p50(t), 2) if base is not None else None,
            env=env,
            **kw,
        )

    records = []
    per = args.iters - args.warmup  # timed steps per round
    for b, sides in times.items():
        vllm = np.asarray(sides["vllm"])
        for side, ts in sides.items():
            t = np.asarray(ts)
            extra = {
                "rounds": args.rounds,
                "round_medians_us": [
                    round(p50(t[i * per : (i + 1) * per]), 1) for i in range(args.rounds)
                ],
                "loadavg_1m": [round(x, 2) for x in loads],
                "peer": info,
                "masks": checks,
                "max_whitespace": config.max_whitespace,
                "fill_threads": fill_threads_for(config.fill_threads),
                "helper_start_us": start_delay,
            }
            base = vllm if side != "vllm" else None
            records.append(record(b, side, t, base, grammars=names, extra=extra))
    for i, (theirs, ours) in enumerate(one_row):
        extra = {"state": i, "tail": tok.decode(rows[i][1][-3:])}
        kind = [names[rows[i][0]]]
        for side, t, base in (("vllm", theirs, None), ("engine", ours, theirs)):
            records.append(record(1, f"{side}_state", t, base, grammars=kind, extra=extra))
    return records


def _one_row_states(
    args: argparse.Namespace,
    peer: Peer,
    filler: BitmaskFiller,
    guides: list[RequestGuide],
    decoded: list[Callable[[], None]],
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One row at each of the first ``--one-row-states`` states, vLLM and the engine in
    turn (the order alternating): one state alone says little about a batch of one,
    whose cost swings tenfold between a structural state and one inside a string."""
    out = []
    for i in range(min(args.one_row_states, len(guides))):
        got: dict[str, np.ndarray] = {}
        for part in ("vllm", "ours") if i % 2 == 0 else ("ours", "vllm"):
            if part == "vllm":
                t = peer.ask(cmd="time", batch=1, start=i, steps=args.iters)["times_us"]
                got[part] = np.asarray(t[args.warmup :])
            else:
                got[part] = side_by_side(
                    {"engine": _fill(filler, [0], guides[i : i + 1])},
                    iters=args.iters - args.warmup,
                    warmup=args.warmup,
                    device="cpu",
                    between=decoded[i],
                )["engine"]
        out.append((got["vllm"], got["ours"]))
    return out


def _fill(filler: BitmaskFiller, index: list[int], guides: list[RequestGuide]) -> Method:
    return lambda: lambda: filler.fill(index, guides)


def _check(
    peer: Peer, fillers: dict[str, BitmaskFiller], guides: list[RequestGuide], b: int, tok: Any
) -> dict[str, int]:
    """The engine's masks with the guard off equal vLLM's on every ordinary id; how
    many rows the guard changes."""
    reply = peer.ask(cmd="masks", batch=b)
    theirs = np.frombuffer(base64.b64decode(reply["data"]), dtype=np.int32).reshape(reply["shape"])
    theirs = theirs[:b].view(np.uint32)
    index = list(range(b))
    off = fillers["unguarded"].fill(index, guides).buffer[:b].numpy().view(np.uint32).copy()
    on = fillers["engine"].fill(index, guides).buffer[:b].numpy().view(np.uint32).copy()
    special = np.zeros(off.shape[1] * 32, dtype=bool)
    special[sorted(tok.special_ids)] = True
    special[tok.vocab_rows :] = True
    ordinary = np.packbits(~special, bitorder="little").view(np.uint32)
    differ = ((off ^ theirs) & ordinary).any(axis=1)
    if differ.any():
        raise AssertionError(
            f"the engine's unguarded masks differ from vLLM's on ordinary ids in rows "
            f"{np.flatnonzero(differ)[:8].tolist()}"
        )
    changed = int((on != off).any(axis=1).sum())
    return {"rows": b, "rows_equal_to_vllm": b, "rows_the_guard_changes": changed}


def table(records: list[Record]) -> str:
    by: dict[int, dict[str, Record]] = {}
    for r in records:
        if "state" not in r.extra:
            by.setdefault(r.batch_size, {})[r.method] = r
    head = (
        f"{'batch':>6}  {'vLLM p50':>10}  {'engine p50':>11}{'vLLM/engine':>13}"
        f"  {'bound off':>10}{'on/boff':>8}  {'guard off':>10}{'on/off':>8}"
        f"  rounds (engine, vLLM)"
    )
    lines = [head, "-" * len(head)]
    for b, m in sorted(by.items()):
        v, e, f, u = m["vllm"], m["engine"], m["bound_off"], m["unguarded"]
        ep = m["engine_paired"].median_us  # the engine interleaved with f and u
        lines.append(
            f"{b:>6}  {v.median_us / 1e3:>7.3f} ms  {e.median_us / 1e3:>8.3f} ms"
            f"{e.ratio:>12.2f}x  {f.median_us / 1e3:>7.3f} ms{ep / f.median_us:>7.2f}x"
            f"  {u.median_us / 1e3:>7.3f} ms{ep / u.median_us:>7.2f}x"
            f"  {e.extra['round_medians_us']} {v.extra['round_medians_us']}"
        )
    load = records[0].extra["loadavg_1m"] if records else []
    lines.append(f"load average (1 min) at each round's start and at the end: {load}")
    line = one_row_line([asdict(r) for r in records])
    if line:
        lines.append(line)
    if records:
        lines.append(threads_line(records[0].extra))
    return "\n".join(lines)
