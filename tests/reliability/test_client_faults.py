"""A client misbehaves against a served engine: a front end killed or frozen while its
requests run, frozen past its timeout and thawed, a stream read slowly, a client that
never reads, a flood past --max-waiting. In each, nothing hangs, nothing is orphaned,
every request ends once, and nobody else loses an answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ipc import (
    EngineCoreRequest,
    FinishReason,
    Heartbeat,
    MsgType,
    SamplingParams,
    StructuredOutputSpec,
)
from tests.support.processes import ROOT

from .conftest import serve
from .support import (
    CLIENT_BACKLOG,
    CLIENT_TIMEOUT_S,
    FAULTS_ENGINE_ARGS,
    MAX_WAITING,
    PACED,
    PROMPT,
    SCHEMA,
    RawPeer,
    assert_nothing_left,
    background,
    drain,
    figures_report,
    outputs_of,
    rss_kib,
    wait_until,
)

FIGURES: dict[str, object] = {}
report = figures_report("client faults", FIGURES)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve(
        [*FAULTS_ENGINE_ARGS, "--compile-workers", "0", *PACED], tmp_path_factory, "client-faults"
    )


@pytest.fixture(autouse=True)
def nothing_left_behind(request, served):
    """After each test on the shared engine: no request, guide or compile is left."""
    yield
    assert_nothing_left(served, request.node.name)


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
        wait_until(
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
            return await drain(
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
