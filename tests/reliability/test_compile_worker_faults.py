"""A compile worker dies under a served engine: killed mid-compile, it is replaced and
the compile tried once more; killed on the retry too, only its request fails; killed
while idle, it is replaced before its next job. Nobody else loses an answer."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from ipc import (
    EngineCoreRequest,
    FinishReason,
    SamplingParams,
    StructuredOutputSpec,
)

from .conftest import serve
from .support import (
    FAULTS_ENGINE_ARGS,
    MEDIUM_SCHEMA,
    PACED,
    PROMPT,
    SLOW_SCHEMA,
    alive,
    assert_nothing_left,
    background,
    busy_worker,
    drain,
    idle_workers,
    ready_workers,
    wait_until,
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve([*FAULTS_ENGINE_ARGS, *PACED], tmp_path_factory, "worker-faults")


@pytest.fixture(autouse=True)
def nothing_left_behind(request, served):
    """After each test on the shared engine: no request, guide or compile is left."""
    yield
    assert_nothing_left(served, request.node.name)


def test_a_compile_worker_killed_mid_compile_costs_nobody(served):
    """Killed from outside mid-compile (the OOM killer, an operator), a worker is
    replaced and the compile tried once more: the request runs as if nothing had
    happened."""
    pid = served.engine.pid
    with background(served.loop, served.client):
        idle_workers(pid, 2, served.engine.log)
        fut = served.loop.submit(
            lambda: drain(
                served.client,
                EngineCoreRequest(
                    "survivor",
                    PROMPT,
                    SamplingParams(max_tokens=8),
                    StructuredOutputSpec("json_schema", MEDIUM_SCHEMA),
                ),
            )
        )
        busy = busy_worker(pid)
        os.kill(busy, signal.SIGKILL)
        out = fut.result(120)
        assert out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), out
        idle_workers(pid, 2, served.engine.log)  # the pool is whole again
    assert (
        f"worker {busy} died (code -9) on a json_schema; trying it once more" in served.engine.log()
    )


def test_a_grammar_whose_worker_dies_twice_fails_only_its_request(served):
    pid = served.engine.pid
    spec = StructuredOutputSpec("json_schema", SLOW_SCHEMA)
    with background(served.loop, served.client):
        idle_workers(pid, 2, served.engine.log)
        fut = served.loop.submit(
            lambda: drain(
                served.client,
                EngineCoreRequest("victim", PROMPT, SamplingParams(max_tokens=4), spec),
            )
        )
        first = busy_worker(pid)
        known = ready_workers(served.engine.log())
        os.kill(first, signal.SIGKILL)
        wait_until(
            lambda: ready_workers(served.engine.log()) - known, 60, "a new worker for the retry"
        )
        second = busy_worker(pid, exclude=known)  # the retry, on the new worker
        os.kill(second, signal.SIGKILL)
        out = fut.result(60)
        assert out.finish_reason == FinishReason.ERROR and "compiler failed" in out.error, out
        assert _after_crash(served, "mid") == []  # the next grammars compile
        idle_workers(pid, 2, served.engine.log)
    assert served.engine.proc.poll() is None


def test_a_compile_worker_killed_while_idle_costs_nobody(served):
    """Killed while idle, a worker is replaced before any job comes for it (its
    dispatcher looks while it waits), and the next grammars compile."""
    pid = served.engine.pid
    with background(served.loop, served.client):
        before = idle_workers(pid, 2, served.engine.log)
        os.kill(before[0], signal.SIGKILL)
        wait_until(lambda: not alive(before[0]), 10, "the idle worker exits")
        replaced = idle_workers(pid, 2, served.engine.log)  # no job sent meanwhile
        assert before[0] not in replaced
        assert f"worker {before[0]} exited (code -9) while idle" in served.engine.log()
        assert _after_crash(served, "idle") == []
        idle_workers(pid, 2, served.engine.log)


def _after_crash(served, tag: str) -> list:
    """Four new grammars, compiled and run; returns the errors."""
    outs = served.run(
        lambda: asyncio.gather(
            *(
                drain(
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
