"""How long the engine process takes to exit on SIGTERM, idle and under load, and
what it leaves behind.

``python -m bench.shutdown [--repeats 3] [--requests 64]`` starts ``python -m
engine_core`` (random model, its own temp folder as TMPDIR), waits for its handshake,
then:

- start: sends SIGTERM as soon as it says it listens (its compile workers are still
  starting) and times the exit;
- idle: connects, waits for one health reply, then sends SIGTERM and times the exit;
- load: first runs ``--requests`` long requests (half of them under a JSON schema),
  waits until each has begun to write, then sends SIGTERM and times the exit.

``--baseline-root DIR`` times the engine of another checkout too, run by run beside
this one (``git worktree add /tmp/base <commit>``).

For each run it checks that every stream got exactly one final output, aborted with an
error saying the engine shut down, and that nothing is left: no compile worker alive,
nothing in the temp folder. Prints each run and the medians. The goals (issue 12):
under 3 s idle, under 5 s under load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from engine_core.client import EngineClient
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
)


@dataclass
class Run:
    mode: str
    exit_s: float
    code: int
    requests: int
    #: requests still running when the signal was sent
    running: int
    finals_ok: int
    left_workers: int
    left_files: list[str]

    @property
    def clean(self) -> bool:
        return (
            self.code == 0
            and self.finals_ok == self.requests
            and not self.left_workers
            and not self.left_files
        )


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class Engine:
    """``python -m engine_core`` with a temp folder of its own."""

    def __init__(self, extra_args: list[str], root: Path) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="shutdown-bench-")
        env = dict(os.environ, TMPDIR=self.tmp.name, PYTHONPATH=str(root))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_core", "--model", "random", *extra_args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=root,  # python -m looks in the working directory first
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.kill()
            raise RuntimeError(f"the engine did not start: {line!r}")
        self.address = line.split("listening on", 1)[1].strip()

    def left_files(self) -> list[str]:
        return sorted(str(p.relative_to(self.tmp.name)) for p in Path(self.tmp.name).rglob("*"))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.tmp.cleanup()


async def _stream(client: EngineClient, req: EngineCoreRequest, started: asyncio.Semaphore) -> bool:
    """Whether the request got exactly one final output: aborted because the engine
    shut down, or (a constrained one whose grammar ended before the signal) a normal
    one."""
    outs = []
    try:
        async for out in client.generate(req):
            if not outs:
                started.release()
            outs.append(out)
    except Exception:  # noqa: BLE001 - counted as not ok
        return False
    finals = [o for o in outs if o.finished]
    if len(finals) != 1 or outs[-1] is not finals[0]:
        return False
    final = finals[0]
    if final.error is None:
        return req.structured_output is not None and final.finish_reason in (
            FinishReason.STOP,
            FinishReason.LENGTH,
        )
    return final.finish_reason == FinishReason.ABORT and final.error == "the engine shut down"


async def one_run(mode: str, n_requests: int, extra_args: list[str], root: Path) -> Run:
    engine = Engine(extra_args, root)
    if mode == "start":  # the moment it listens: its compile workers are still starting
        try:
            workers = _children(engine.proc.pid)
            t0 = time.monotonic()
            engine.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(engine.proc.wait, 60)
            exit_s = time.monotonic() - t0
            left = sum(_alive(p) for p in workers)
            return Run(mode, exit_s, code, 0, 0, 0, left, engine.left_files())
        finally:
            engine.close()
    try:
        client = await EngineClient.connect(engine.address, timeout_s=120)
        tasks: list[asyncio.Task[bool]] = []
        try:
            if mode == "load":
                prompt = client.tokenizer().encode(
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
                )
                started = asyncio.Semaphore(0)
                for i in range(n_requests):
                    spec = StructuredOutputSpec("json_schema", SCHEMA) if i % 2 else None
                    req = EngineCoreRequest(
                        f"r{i}",
                        prompt,
                        SamplingParams(max_tokens=30_000, ignore_eos=True, seed=i),
                        spec,
                    )
                    tasks.append(asyncio.create_task(_stream(client, req, started)))
                for _ in range(n_requests):  # every request has begun to write
                    await asyncio.wait_for(started.acquire(), 120)
                running = (await client.health()).num_running
            else:
                # the client loads its tokenizer in the background (holding the GIL for
                # a second or two): done before the clock starts, not timed as the exit
                await asyncio.to_thread(client.tokenizer)
                await client.health()
                running = 0
            workers = _children(engine.proc.pid)
            t0 = time.monotonic()
            engine.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(engine.proc.wait, 60)
            exit_s = time.monotonic() - t0
            oks = await asyncio.wait_for(asyncio.gather(*tasks), 30) if tasks else []
        finally:
            await client.close()
        return Run(
            mode,
            exit_s,
            code,
            len(tasks),
            running,
            sum(oks),
            sum(_alive(p) for p in workers),
            engine.left_files(),
        )
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.shutdown", description=__doc__)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each mode (default: 3)")
    ap.add_argument(
        "--requests", type=int, default=64, help="requests in flight under load (default: 64)"
    )
    ap.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        help="one more argument for python -m engine_core (repeatable)",
    )
    ap.add_argument(
        "--baseline-root",
        type=Path,
        help="also time the engine of another checkout (an older commit, say), run by "
        "run beside this one",
    )
    args = ap.parse_args(argv)
    roots = {"this": ROOT}
    if args.baseline_root is not None:
        roots["baseline"] = args.baseline_root.resolve()
    runs: list[tuple[str, Run]] = []
    modes = ("start", "idle", "load")
    for mode in modes:
        for _ in range(args.repeats):
            for name, root in roots.items():
                run = asyncio.run(one_run(mode, args.requests, args.engine_arg, root))
                runs.append((name, run))
                print(
                    f"{name:8} {run.mode:5} exit {run.exit_s:5.2f} s  code {run.code}  "
                    f"running at the signal {run.running}  "
                    f"finals ok {run.finals_ok}/{run.requests}  "
                    f"workers left {run.left_workers}  files left {run.left_files}",
                    flush=True,
                )
    for mode in modes:
        for name in roots:
            times = [r.exit_s for n, r in runs if r.mode == mode and n == name]
            print(f"{name} {mode}: median {statistics.median(times):.2f} s, max {max(times):.2f} s")
    return 0 if all(r.clean for n, r in runs if n == "this") else 1


if __name__ == "__main__":
    sys.exit(main())
