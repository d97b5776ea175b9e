"""Faults: an engine killed under load, a front end killed while its requests run, a
compile worker killed mid-compile, a stream nobody reads, a client that never reads.
In each, nothing hangs, nothing is orphaned, and nobody else loses an answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_core.client import EngineClient, EngineDeadError
from engine_core.config import EngineConfig
from ipc import (
    EngineCoreRequest,
    FinishReason,
    Heartbeat,
    MsgType,
    SamplingParams,
    StructuredOutputSpec,
)
from structured_output.config import StructuredOutputConfig
from tests.support.processes import ROOT

from .conftest import serve
from .support import (
    PROMPT,
    SCHEMA,
    RawPeer,
    alive,
    background,
    children,
    outputs_of,
    rss_kib,
)

#: a schema that takes xgrammar tens of seconds to compile on this machine
SLOW_SCHEMA = json.dumps(
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2500)}}
)
#: one that takes a few seconds to compile (2.5 s here when the machine is quiet), and
#: not too much to send back (52 MB serialized)
MEDIUM_SCHEMA = json.dumps({"enum": [f"member-{i}" for i in range(20_000)]})
FIGURES: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if FIGURES:
        print("\nfaults:", FIGURES)


def _workers(engine_pid: int) -> list[int]:
    return [p for p in children(engine_pid) if b"compile_worker" in _read(f"/proc/{p}/cmdline")]


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return b""


def _wait(cond, timeout_s: float, what: str, step: float = 0.05) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(step)
    return time.monotonic() - t0


# ----- the engine dies --------------------------------------------------------------


def test_engine_killed_under_load_fails_every_request_within_2s_and_a_new_one_starts():
    async def body():
        client = await EngineClient.spawn(
            EngineConfig(model="random", reasoning_parser="qwen3", max_num_seqs=256, seed=5)
        )
        tok = client.tokenizer()
        think_prompt = tok.encode(
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        )
        failures: dict[str, float] = {}
        other: list[BaseException | str] = []

        async def one(i: int) -> None:
            kind = i % 4
            so = None
            if kind == 1:
                so = StructuredOutputSpec("json_schema", json.dumps(SCHEMA))
            elif kind == 2:
                so = StructuredOutputSpec("regex", "[a-z ]{1,20000}")
            req = EngineCoreRequest(
                f"load-{i}",
                think_prompt if kind == 3 else PROMPT,
                SamplingParams(max_tokens=30_000, ignore_eos=True, seed=i),
                so,
                reasoning_ended=False if kind == 3 else None,
            )
            try:
                async for out in client.generate(req):
                    if out.finished:
                        other.append(f"{req.request_id} ended: {out.finish_reason} {out.error}")
            except EngineDeadError:
                failures[req.request_id] = time.monotonic()
            except BaseException as e:  # noqa: BLE001 - reported below
                other.append(e)

        n = 300  # more than max_num_seqs: some are waiting when the engine dies
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        while (await client.health()).num_running < 200:
            await asyncio.sleep(0.1)
        workers = _workers(client.proc.pid)
        killed = time.monotonic()
        os.kill(client.proc.pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        # the dead engine refuses new work at once, and its workers do not outlive it
        with pytest.raises(EngineDeadError):
            await client.health()
        with pytest.raises(EngineDeadError):
            async for _ in client.generate(EngineCoreRequest("late", PROMPT)):
                pass
        await client.shutdown(timeout_s=5)
        orphans_gone = await asyncio.to_thread(
            _wait, lambda: not any(alive(p) for p in workers), 30, "compile workers exit"
        )
        # a new engine starts and serves
        t0 = time.monotonic()
        fresh = await EngineClient.spawn(EngineConfig(model="random", seed=6))
        try:
            startup = time.monotonic() - t0
            last = None
            async for out in fresh.generate(
                EngineCoreRequest("after", PROMPT, SamplingParams(max_tokens=5, ignore_eos=True))
            ):
                last = out
            assert last is not None and last.finish_reason == FinishReason.LENGTH
        finally:
            await fresh.shutdown()
        return n, killed, failures, other, orphans_gone, startup, len(workers)

    n, killed, failures, other, orphans_gone, startup, nworkers = asyncio.run(body())
    assert other == []
    assert len(failures) == n
    latency = max(failures.values()) - killed
    FIGURES["engine SIGKILL"] = (
        f"{n} requests in flight (256 running), all failed "
        f"{min(failures.values()) - killed:.2f}-{latency:.2f} s after the kill; "
        f"{nworkers} compile workers gone {orphans_gone:.1f} s later; "
        f"new engine up in {startup:.1f} s"
    )
    assert latency < 2.0


def test_compile_workers_exit_when_the_engine_is_killed_mid_compile():
    """A worker busy with a long compile reads nothing from its pipe, so it would
    compile on, orphaned, for the whole grammar (80 s for this one here) after its
    engine died."""

    async def body():
        client = await EngineClient.spawn(
            EngineConfig(
                model="random", structured_output=StructuredOutputConfig(compile_timeout_s=300)
            )
        )
        try:
            await asyncio.to_thread(_idle_workers, client.proc.pid, 2)
            task = asyncio.create_task(
                _drain(
                    client,
                    EngineCoreRequest(
                        "slow",
                        PROMPT,
                        SamplingParams(max_tokens=4),
                        StructuredOutputSpec("json_schema", SLOW_SCHEMA),
                    ),
                )
            )
            busy = await asyncio.to_thread(_busy_worker, client.proc.pid)
            os.kill(client.proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(EngineDeadError):
                await task
        finally:
            await client.shutdown(timeout_s=5)
        return busy, killed

    busy, killed = asyncio.run(body())
    _wait(lambda: not alive(busy), 15, "the compiling worker exits")
    took = time.monotonic() - killed
    FIGURES["compiling worker after engine SIGKILL"] = f"gone {took:.1f} s after the kill"


def _ticks(pid: int) -> int:
    """CPU time of ``pid`` so far, in clock ticks (0 once it is gone)."""
    fields = _read(f"/proc/{pid}/stat").decode().rsplit(")", 1)[-1].split()
    return int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0


def _idle_workers(engine_pid: int, n: int, log=None, timeout_s: float = 120) -> list[int]:
    """Wait until the engine has ``n`` compile workers, all ready (when its log is
    given: the engine logs each worker it has started) and idle."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = _workers(engine_pid)
        ready = _ready(log()) if log else set(workers)
        if len(workers) == n and set(workers) <= ready:
            t0 = {p: _ticks(p) for p in workers}
            time.sleep(0.5)
            if all(_ticks(p) - t0[p] <= 1 for p in workers):
                return workers
        else:
            time.sleep(0.2)
    raise AssertionError(f"no {n} idle compile workers within {timeout_s} s")


def _busy_worker(engine_pid: int, timeout_s: float = 60, exclude: set[int] = frozenset()) -> int:
    """The compile worker that is compiling: busy on the CPU in two half-second
    windows in a row (a worker just started, or just done, is busy only briefly)."""
    deadline = time.monotonic() + timeout_s
    last: int | None = None
    while time.monotonic() < deadline:
        t0 = {p: _ticks(p) for p in _workers(engine_pid) if p not in exclude}
        time.sleep(0.5)
        delta = {p: _ticks(p) - t for p, t in t0.items()}
        busy = max(delta, key=lambda p: delta[p]) if delta and max(delta.values()) >= 5 else None
        if busy is not None and busy == last:
            return busy
        last = busy
    raise AssertionError("no compile worker got busy")


def _ready(log: str) -> set[int]:
    return set(map(int, re.findall(r"compile worker (\d+) is ready", log)))


async def _drain(client: EngineClient, req: EngineCoreRequest):
    last = None
    async for out in client.generate(req):
        last = out
    return last


# ----- an engine served as an operator serves it ----------------------------------

CLIENT_TIMEOUT_S = 2.0
MAX_WAITING = 200
CLIENT_BACKLOG = 1000


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve(
        [
            "--model",
            "random",
            "--max-num-seqs",
            "128",
            "--client-timeout-s",
            str(CLIENT_TIMEOUT_S),
            "--max-waiting",
            str(MAX_WAITING),
            "--client-backlog",
            str(CLIENT_BACKLOG),
            "--compile-timeout-s",
            "120",
            "--seed",
            "21",
        ],
        tmp_path_factory,
        "faults",
    )


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_dead_or_frozen_front_end_leaves_no_orphan_work(served, how):
    """A front end process (a real client in a subprocess) with 40 running requests is
    killed, or frozen. Killed, its connection closes and the engine drops it at its
    next send; frozen, it answers no heartbeat and is dropped after --client-timeout-s.
    Either way its requests end in the engine: no orphan work, no guides left."""
    n = 40
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log_before = served.engine.log()
    with background(served.loop, served.client):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.dying_client", served.client.address, str(n)],
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == b"running", line
            during = served.run(served.client.health)
            assert during.num_requests >= n and during.num_clients == 2
            os.kill(proc.pid, getattr(signal, how))
            hit = time.monotonic()

            async def drained():
                while True:
                    h = await served.client.health()
                    # what is left is the background's own (its concurrency is 8)
                    if h.num_requests <= 8 and h.num_clients == 1:
                        return h
                    await asyncio.sleep(0.05)

            served.run(drained, 60)
            took = time.monotonic() - hit
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
    log = served.engine.log()[len(log_before) :]
    assert f"dropped {n} requests of client" in log
    # killed: its connection closes at once; frozen: ZeroMQ's heartbeats go unanswered
    # for --client-timeout-s and the engine closes it
    assert "is gone (its connection closed" in log
    after = served.run(served.client.health)
    assert after.num_running == 0 and after.num_requests == 0 and after.num_guides == 0
    FIGURES[f"front end {how}"] = (
        f"{n} running requests dropped {took:.2f} s after the signal "
        f"(--client-timeout-s {CLIENT_TIMEOUT_S:g})"
    )
    assert took < CLIENT_TIMEOUT_S + 10


def test_a_front_end_frozen_past_its_timeout_gets_every_request_ended_when_it_thaws(served):
    """Frozen (a long GC pause, a debugger, a swapped-out host) past --client-timeout-s,
    a front end has its requests dropped by the engine. When it thaws, each of its
    streams must still end (with an error that says why), not wait forever; and it
    must be served again."""
    n = 10
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log_before = served.engine.log()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.frozen_client", served.client.address, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        os.kill(proc.pid, signal.SIGSTOP)
        _wait(
            lambda: f"dropped {n} requests of client" in served.engine.log()[len(log_before) :],
            CLIENT_TIMEOUT_S + 30,
            "the engine drops the frozen client",
        )
        os.kill(proc.pid, signal.SIGCONT)
        thawed = time.monotonic()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the thawed front end did not finish: {out}\n{err}") from None
        took = time.monotonic() - thawed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    ended = [line for line in out.splitlines() if line.startswith("ended ")]
    assert len(ended) == n, out
    assert all("error" in line and "dropped" in line for line in ended), out
    assert "after-thaw length None" in out and out.rstrip().endswith("done"), out
    FIGURES["front end frozen past its timeout"] = f"{n} streams ended {took:.1f} s after it thawed"


def test_a_compile_worker_killed_mid_compile_costs_nobody(served):
    """Killed from outside mid-compile (the OOM killer, an operator), a worker is
    replaced and the compile tried once more: the request runs as if nothing had
    happened."""
    pid = served.engine.pid
    with background(served.loop, served.client):
        _idle_workers(pid, 2, served.engine.log)
        fut = served.loop.submit(
            lambda: _drain(
                served.client,
                EngineCoreRequest(
                    "survivor",
                    PROMPT,
                    SamplingParams(max_tokens=8),
                    StructuredOutputSpec("json_schema", MEDIUM_SCHEMA),
                ),
            )
        )
        busy = _busy_worker(pid)
        os.kill(busy, signal.SIGKILL)
        out = fut.result(120)
        assert out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), out
        _idle_workers(pid, 2, served.engine.log)  # the pool is whole again
    assert (
        f"worker {busy} died (code -9) on a json_schema; trying it once more" in served.engine.log()
    )


def test_a_grammar_whose_worker_dies_twice_fails_only_its_request(served):
    pid = served.engine.pid
    spec = StructuredOutputSpec("json_schema", SLOW_SCHEMA)
    with background(served.loop, served.client):
        _idle_workers(pid, 2, served.engine.log)
        fut = served.loop.submit(
            lambda: _drain(
                served.client,
                EngineCoreRequest("victim", PROMPT, SamplingParams(max_tokens=4), spec),
            )
        )
        first = _busy_worker(pid)
        known = _ready(served.engine.log())
        os.kill(first, signal.SIGKILL)
        _wait(lambda: _ready(served.engine.log()) - known, 60, "a new worker for the retry")
        second = _busy_worker(pid, exclude=known)  # the retry, on the new worker
        os.kill(second, signal.SIGKILL)
        out = fut.result(60)
        assert out.finish_reason == FinishReason.ERROR and "compiler failed" in out.error, out
        assert _after_crash(served, "mid") == []  # the next grammars compile
        _idle_workers(pid, 2, served.engine.log)
    assert served.engine.proc.poll() is None


def test_a_compile_worker_killed_while_idle_costs_nobody(served):
    pid = served.engine.pid
    with background(served.loop, served.client):
        before = _idle_workers(pid, 2, served.engine.log)
        os.kill(before[0], signal.SIGKILL)
        _wait(lambda: not alive(before[0]), 10, "the idle worker exits")
        assert _after_crash(served, "idle") == []
        after = _idle_workers(pid, 2, served.engine.log)
    assert before[0] not in after
    # found dead before the job, or (when its threads were still exiting) on the job,
    # which then ran again on a new worker
    log = served.engine.log()
    assert (
        f"worker {before[0]} exited (code -9) while idle" in log
        or f"worker {before[0]} died (code -9) on a regex; trying it once more" in log
    )


def _after_crash(served, tag: str) -> list:
    """Four new grammars, compiled and run; returns the errors."""
    outs = served.run(
        lambda: asyncio.gather(
            *(
                _drain(
                    served.client,
                    EngineCoreRequest(
                        f"after-{tag}-{i}",
                        PROMPT,
                        SamplingParams(max_tokens=64),
                        StructuredOutputSpec("regex", f"[0-9]{{3}}-{tag}-{i}"),
                    ),
                )
                for i in range(4)
            )
        )
    )
    return [
        (o.request_id, o.error)
        for o in outs
        if o.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH)
    ]


@contextlib.contextmanager
def peer_closing(peer: RawPeer):
    try:
        yield peer
    finally:
        peer.close()


def test_a_slow_reader_delays_no_other_stream(served):
    """One stream's consumer sleeps between outputs; the engine does not wait for it:
    the other streams finish, and the engine has finished the slow one too (its
    outputs wait in that stream's queue), while the slow reader has read few."""
    client = served.client

    async def body():
        slow_read: list[int] = []
        fast_done = asyncio.Event()

        async def slow():
            n = 0
            async for out in client.generate(
                EngineCoreRequest(
                    "slow-reader", PROMPT, SamplingParams(max_tokens=60, ignore_eos=True)
                )
            ):
                n += 1
                slow_read.append(n)
                if out.finished:
                    return n, out
                if not fast_done.is_set():
                    await asyncio.sleep(0.5)

        async def fast(i):
            return await _drain(
                client,
                EngineCoreRequest(
                    f"fast-{i}",
                    PROMPT,
                    SamplingParams(max_tokens=60, ignore_eos=True, seed=i),
                    StructuredOutputSpec("json_schema", json.dumps(SCHEMA)) if i % 2 else None,
                ),
            )

        s = asyncio.create_task(slow())
        outs = await asyncio.gather(*(fast(i) for i in range(16)))
        read_when_fast_done = len(slow_read)
        while (h := await client.health()).num_requests:
            await asyncio.sleep(0.05)
        read_when_engine_done = len(slow_read)
        fast_done.set()
        n, final = await s
        return outs, read_when_fast_done, read_when_engine_done, n, final, h

    outs, at_fast, at_engine, n, final, h = served.run(body)
    assert all(
        o.finished and o.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) for o in outs
    )
    assert final.finish_reason == FinishReason.LENGTH
    FIGURES["slow reader"] = (
        f"16 other streams done when it had read {at_fast} outputs; the engine "
        f"done with it at {at_engine}; it read {n} in the end"
    )
    assert at_engine < n  # the engine finished it while its reader still lagged
    assert h.num_running == 0


def test_a_client_that_never_reads_is_dropped_at_its_backlog(served):
    """A peer that sends requests and a stream of bad frames (each answered with an
    ErrorNotice), and heartbeats, but never reads. The engine queues at most
    --client-backlog messages for it, then drops it (its requests end) and serves
    everyone else on; its memory stays bounded."""
    pid = served.engine.pid
    log_before = served.engine.log()
    with background(served.loop, served.client):
        peer = RawPeer(served.client.address, rcvhwm=4)
        try:
            peer.hello()
            before = rss_kib(pid)
            for i in range(32):
                peer.send_msg(
                    EngineCoreRequest(
                        f"unread-{i}", PROMPT, SamplingParams(max_tokens=20_000, ignore_eos=True)
                    )
                )
            t0 = time.monotonic()
            sent = 0
            while "does not read" not in served.engine.log()[len(log_before) :]:
                assert time.monotonic() - t0 < 60, "the engine never dropped the client"
                for _ in range(500):
                    peer.send([bytes([MsgType.REQUEST]), b"\xc1"])
                sent += 500
                peer.send_msg(Heartbeat(time.time()))
                time.sleep(0.05)
            took = time.monotonic() - t0

            async def drained():
                while (h := await served.client.health()).num_requests > 8 or h.num_clients != 1:
                    await asyncio.sleep(0.05)

            served.run(drained, 60)
            after = rss_kib(pid)
            # it may say HELLO again and be served (once it reads)
            peer2 = RawPeer(served.client.address)
            try:
                peer2.hello()
                assert peer2.health(77)[0].nonce == 77
            finally:
                peer2.close()
        finally:
            peer.close()
    assert "dropped 32 requests of client" in served.engine.log()[len(log_before) :]
    FIGURES["client that never reads"] = (
        f"dropped after {sent} unread replies ({took:.1f} s; --client-backlog {CLIENT_BACKLOG}); "
        f"engine RSS {before / 1024:.0f} -> {after / 1024:.0f} MiB"
    )
    assert after - before < 200 * 1024


def test_a_flood_is_refused_past_max_waiting_and_every_request_ends_once(served):
    n = 3000
    pid = served.engine.pid
    peer = RawPeer(served.client.address)
    with background(served.loop, served.client, full_ok=True), peer_closing(peer):
        peer.hello()
        before = rss_kib(pid)
        t0 = time.monotonic()
        finals: dict[str, object] = {}

        def take(timeout_s: float) -> bool:
            msg = peer.recv(timeout_s)
            for o in outputs_of([msg] if msg is not None else []):
                if o.finished:
                    assert o.request_id not in finals, f"two finals for {o.request_id}"
                    finals[o.request_id] = o
            return msg is not None

        for i in range(n):  # as fast as it can, reading whatever has come meanwhile
            peer.send_msg(
                EngineCoreRequest(
                    f"flood-{i}", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True)
                )
            )
            while take(0):
                pass
        while len(finals) < n:
            assert take(60), f"{n - len(finals)} requests never ended"
        took = time.monotonic() - t0
        peak = rss_kib(pid)
    refused = [o for o in finals.values() if o.finish_reason == FinishReason.ERROR]
    ran = [o for o in finals.values() if o.finish_reason == FinishReason.LENGTH]
    assert len(refused) + len(ran) == n
    assert refused and all("engine is full" in o.error for o in refused)
    assert len(ran) >= 128 + MAX_WAITING - 8  # the background holds up to 8
    h = served.run(served.client.health)
    assert h.num_requests == 0 and h.num_guides == 0
    FIGURES["flood"] = (
        f"{n} requests at once: {len(ran)} ran, {len(refused)} refused as full, "
        f"each ended once in {took:.1f} s; RSS {before / 1024:.0f} -> {peak / 1024:.0f} MiB"
    )


@pytest.fixture(autouse=True)
def nothing_left_behind(request):
    """After each test on the shared engine: no request, guide or compile is left."""
    yield
    if "served" not in request.fixturenames:
        return
    served = request.getfixturevalue("served")

    async def settled():
        for _ in range(200):
            h = await served.client.health()
            if not (h.num_requests or h.num_guides or h.num_compiling):
                return h
            await asyncio.sleep(0.05)
        return h

    h = served.run(settled, 60)
    print(f"[{request.node.name}: engine RSS {rss_kib(served.engine.pid) / 1024:.0f} MiB after]")
    assert (h.num_requests, h.num_guides, h.num_compiling) == (0, 0, 0), h
