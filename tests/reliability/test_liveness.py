"""Liveness judged on evidence: an engine killed under a connected client fails its
streams within 2 s; a client that stalls its own process for 5 s (stopped by a
signal, or holding the GIL) neither declares the engine dead nor is dropped by it; an
IO thread that dies ends the engine's loop and fails every stream of its clients."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from engine_core.client import EngineClient, EngineDeadError
from engine_core.config import EngineConfig
from engine_core.server import EngineServer
from ipc import EngineCoreRequest, SamplingParams, free_tcp_port
from tests.support.engine import NO_WORKERS, LoopThread, ServedEngine
from tests.support.processes import ROOT

from .support import PROMPT

#: longer than the client's reconnect grace (2 s) and several pings (1 s)
STALL_S = 5.0
FIGURES: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if FIGURES:
        print("\nliveness:", FIGURES)


def _long(rid: str) -> EngineCoreRequest:
    return EngineCoreRequest(rid, PROMPT, SamplingParams(max_tokens=20_000, ignore_eos=True))


async def _streams_fail(client: EngineClient, n: int, started: asyncio.Event, prefix: str):
    """Run ``n`` long requests; return, per request, when it raised EngineDeadError
    (or what else happened)."""
    seen: set[str] = set()
    ends: dict[str, float | str] = {}

    async def one(i: int) -> None:
        rid = f"{prefix}-{i}"
        try:
            async for out in client.generate(_long(rid)):
                seen.add(rid)
                if len(seen) == n:
                    started.set()
                if out.finished:
                    ends[rid] = f"finished: {out.finish_reason} {out.error}"
        except EngineDeadError:
            ends[rid] = time.monotonic()
        except Exception as e:  # noqa: BLE001 - reported by the test
            ends[rid] = repr(e)

    await asyncio.gather(*(one(i) for i in range(n)))
    return ends


# ----- the engine dies under a connected client ----------------------------------------


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_sigkill_of_the_engine_fails_every_stream_of_a_connected_client_within_2s(
    tmp_path, transport
):
    address = f"tcp://127.0.0.1:{free_tcp_port()}" if transport == "tcp" else None
    engine = ServedEngine(
        ["--model", "random", "--max-num-seqs", "32", "--compile-workers", "0"],
        tmp_path / "e.log",
        address=address,
    )
    loop = LoopThread()
    n = 24
    try:

        async def body():
            client = await EngineClient.connect(engine.address, timeout_s=120)
            started = asyncio.Event()
            task = asyncio.create_task(_streams_fail(client, n, started, "doomed"))
            await asyncio.wait_for(started.wait(), 120)
            killed = time.monotonic()
            os.kill(engine.pid, signal.SIGKILL)
            ends = await asyncio.wait_for(task, 30)
            with pytest.raises(EngineDeadError):
                await client.health()
            reason = client.dead_reason
            await client.close()
            return killed, ends, reason

        killed, ends, reason = loop.run(body)
    finally:
        loop.close()
        engine.stop()
    others = {rid: e for rid, e in ends.items() if not isinstance(e, float)}
    assert others == {} and len(ends) == n
    latency = max(ends.values()) - killed  # type: ignore[operator]
    FIGURES[f"engine SIGKILL, connected client ({transport})"] = (
        f"{n} streams failed {latency:.2f} s after the kill: {reason}"
    )
    assert latency < 2.0, reason


# ----- a client that stalls its own process ---------------------------------------------


@pytest.fixture(scope="module")
def slow_engine(tmp_path_factory):
    """Default timeouts; steps slowed so that requests run through a 5 s stall."""
    e = ServedEngine(
        [
            "--model",
            "random",
            "--max-num-seqs",
            "16",
            "--forward-ms",
            "40",
            "--compile-workers",
            "0",
        ],
        tmp_path_factory.mktemp("liveness") / "engine.log",
    )
    yield e
    e.stop()


@pytest.mark.parametrize("how", ["SIGSTOP", "GIL"])
def test_a_client_stalled_for_5s_keeps_its_engine_and_its_requests(slow_engine, how):
    """A front end with 8 running requests stalls for 5 s: stopped (SIGSTOP, then
    SIGCONT), or busy holding the GIL (no other thread of it runs, its IO thread
    included). Afterwards every request finishes in full, the client has not declared
    the engine dead, and the engine has not dropped it."""
    n, max_tokens = 8, 200  # 200 steps of >= 40 ms: the requests outlast the stall
    log_before = slow_engine.log()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.reliability.stalling_client",
            slow_engine.address,
            str(n),
            str(max_tokens),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=ROOT,
        text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        t0 = time.monotonic()
        if how == "SIGSTOP":
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(STALL_S)
            os.kill(proc.pid, signal.SIGCONT)
        else:
            proc.stdin.write(f"gil {STALL_S}\n")
            proc.stdin.flush()
            line = proc.stdout.readline().split()
            assert line[0] == "stalled", line
            # the stall was real: the client's IO thread stood still that long
            assert float(line[1]) >= STALL_S - 1, line
        stalled = time.monotonic() - t0
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    ended = [line for line in out.splitlines() if line.startswith("ended ")]
    assert len(ended) == n, out
    for line in ended:
        _, rid, reason, tokens, error = line.split(" ", 4)
        assert reason == "length" and int(tokens) == max_tokens and error == "None", line
    assert "dead None" in out, out
    log = slow_engine.log()[len(log_before) :]
    assert "dropped" not in log and "is gone" not in log, log[-2000:]
    FIGURES[f"client stalled ({how})"] = (
        f"{stalled:.1f} s stall; {n} requests finished in full, nothing dropped"
    )


# ----- a dead IO thread -------------------------------------------------------------


def _break_io_thread(pump) -> None:
    """A fault from outside the code: the IO thread's wake-up pipe is replaced by a
    directory, whose read fails (EISDIR) the next time the thread wakes."""
    d = os.open("/", os.O_RDONLY)
    try:
        os.dup2(d, pump._wake_r)
    finally:
        os.close(d)
    pump._wake()


def test_a_dead_engine_io_thread_ends_the_engine_and_fails_every_stream():
    server = EngineServer(
        EngineConfig(model="random", max_num_seqs=16, structured_output=NO_WORKERS)
    )
    serving = threading.Thread(target=server.serve, name="test-engine", daemon=True)
    serving.start()
    loop = LoopThread()
    n = 8
    try:

        async def body():
            client = await EngineClient.connect(server.address, timeout_s=120)
            started = asyncio.Event()
            task = asyncio.create_task(_streams_fail(client, n, started, "io"))
            await asyncio.wait_for(started.wait(), 120)
            broken = time.monotonic()
            _break_io_thread(server.pump)
            ends = await asyncio.wait_for(task, 30)
            reason = client.dead_reason
            await client.close()
            return broken, ends, reason

        broken, ends, reason = loop.run(body)
        serving.join(30)
        assert not serving.is_alive(), "the engine's loop did not end"
    finally:
        loop.close()
        if serving.is_alive():
            server.stop()
            serving.join(30)
    assert isinstance(server.pump.failure, IsADirectoryError)
    others = {rid: e for rid, e in ends.items() if not isinstance(e, float)}
    assert others == {} and len(ends) == n
    latency = max(ends.values()) - broken  # type: ignore[operator]
    FIGURES["engine IO thread dies"] = f"loop ended; {n} streams failed in {latency:.2f} s"
    assert latency < 2.0, reason


def test_a_dead_client_io_thread_fails_its_streams_and_the_engine_drops_it(slow_engine):
    loop = LoopThread()
    n = 4
    try:

        async def body():
            watcher = await EngineClient.connect(slow_engine.address, load_tokenizer=False)
            client = await EngineClient.connect(slow_engine.address, load_tokenizer=False)
            started = asyncio.Event()
            task = asyncio.create_task(_streams_fail(client, n, started, "cio"))
            await asyncio.wait_for(started.wait(), 120)
            before = await watcher.health()
            broken = time.monotonic()
            _break_io_thread(client._pump)
            ends = await asyncio.wait_for(task, 30)
            with pytest.raises(EngineDeadError, match="IO thread failed"):
                async for _ in client.generate(_long("late")):
                    pass
            # its socket closed with the thread: the engine drops it and its requests
            deadline = time.monotonic() + 30
            while (h := await watcher.health()).num_requests >= before.num_requests:
                assert time.monotonic() < deadline, h
                await asyncio.sleep(0.1)
            await client.close()
            await watcher.close()
            return broken, ends, before, h

        broken, ends, before, after = loop.run(body)
    finally:
        loop.close()
    others = {rid: e for rid, e in ends.items() if not isinstance(e, float)}
    assert others == {} and len(ends) == n
    assert max(ends.values()) - broken < 2.0  # type: ignore[operator]
    assert after.num_clients == before.num_clients - 1
