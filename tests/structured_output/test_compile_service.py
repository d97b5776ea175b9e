"""Compilation off the scheduling thread: cache, sharing, time limit, size limit, in a
worker and in this process (``num_workers=0``; its time limit on a real compile is
tested in a real engine, `tests/engine/test_in_process_compiles.py`, whose exit stops
the compile left running)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from structured_output import CompileOptions, GrammarError, GrammarSpec, tokenizer_info_for
from structured_output.compile_inprocess import InProcessCompiles, PastDeadline
from structured_output.compile_service import CompileService

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
SLOW = json.dumps(
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1500)}}
)


@pytest.fixture(scope="module", params=[1, 0], ids=["one_worker", "in_process"])
def service(request, qwen3):
    svc = CompileService(
        qwen3,
        CompileOptions(max_spec_bytes=200_000),
        tokenizer_info_for(qwen3),
        num_workers=request.param,
        timeout_s=60.0,  # tests of the time limit set their own
        cache_bytes=64 << 20,
        max_compiled_bytes=1 << 20,
    )
    yield svc
    svc.close()


def test_compiles_and_caches(service):
    spec = GrammarSpec.of("json_schema", SCHEMA)
    first = service.submit(spec).result(60)
    again = service.submit(spec)
    assert again.done() and again.result() is first
    assert len(service.cache) >= 1


def test_identical_specs_in_flight_share_one_compile(service):
    spec = GrammarSpec.of("regex", "[a-z]{3,9}-shared")
    a, b = service.submit(spec), service.submit(spec)
    assert a is b
    a.result(60)


def test_errors_are_values(service):
    with pytest.raises(GrammarError, match="parenthesis"):
        service.submit(GrammarSpec.of("regex", "(x")).result(60)
    f = service.submit(GrammarSpec.of("json_schema", "x" * 300_000))
    assert f.done()
    with pytest.raises(GrammarError, match="over the limit"):
        f.result()
    with pytest.raises(GrammarError, match="unknown structured-output kind 'yaml'"):
        GrammarSpec.of("yaml", "")


def test_a_compiled_grammar_over_the_size_limit_is_refused(service):
    props = ",".join(f'"p{i}": {{"type": "string"}}' for i in range(100))  # 1.6 MiB
    big = GrammarSpec.of("json_schema", f'{{"type": "object", "properties": {{{props}}}}}')
    with pytest.raises(
        GrammarError,
        match=r"^the compiled grammar is too large: 1 MiB in memory, over the limit of 1 MiB$",
    ):
        service.submit(big).result(120)
    assert service.cache.get(big) is None
    service.submit(GrammarSpec.of("regex", "[a-c]{2}-small")).result(60)


@pytest.mark.parametrize("service", [1], indirect=True, ids=["one_worker"])
def test_time_limit_kills_the_compile_and_the_service_recovers(service):
    service.timeout_s = 1.0  # read by each compile as it starts
    try:
        t0 = time.monotonic()
        with pytest.raises(GrammarError, match="time limit of 1 s"):
            service.submit(GrammarSpec.of("json_schema", SLOW)).result(120)
        assert time.monotonic() - t0 < 30
    finally:
        service.timeout_s = 60.0
    assert service.num_timeouts >= 1
    # the worker was replaced: the next compile works
    service.submit(GrammarSpec.of("regex", "after-timeout[0-9]")).result(120)


def test_released_before_it_starts_is_never_compiled(service):
    """Both dispatchers busy, a queued spec released by its only request is skipped."""
    first, second = (GrammarSpec.of("regex", f"[a-z]{{2,7}}-busy{i}") for i in range(2))
    third = GrammarSpec.of("regex", "[a-z]{2,7}-released")
    busy = [service.submit(first), service.submit(second)]
    f = service.submit(third)
    service.release(third, f)
    for b in busy:
        b.result(60)
    if f.cancelled():
        assert service.cache.get(third) is None
    else:  # a dispatcher took it before the release: it compiled and is cached
        assert f.result(60) is service.cache.get(third)


# ----- in this process: calls that cannot be stopped, under a deadline ---------------


def _blocked(gate: threading.Event, value: int):
    def call() -> int:
        assert gate.wait(60)
        return value

    return call


def _background(fn):
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_in_process_a_call_past_its_deadline_runs_on_and_is_dropped():
    calls = InProcessCompiles(max_running=2, progress_s=0.05)
    gate = threading.Event()
    waits: list[float] = []
    t0 = time.monotonic()
    with pytest.raises(PastDeadline):
        calls.run(_blocked(gate, 1), t0 + 1.0, lambda: waits.append(time.monotonic()))
    assert time.monotonic() - t0 >= 1.0
    assert len(waits) >= 2  # the wait was reported while it lasted (every 0.05 s)
    assert calls.num_running == 1 and calls.num_overrunning == 1
    # one slot is left: the next call runs at once
    assert calls.run(lambda: 2, time.monotonic() + 30, lambda: None) == 2
    gate.set()
    deadline = time.monotonic() + 30
    while calls.num_running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls.num_running == 0 and calls.num_overrunning == 0


def test_in_process_calls_past_their_deadlines_hold_their_slots():
    """With every slot held by calls past their deadlines, a new call waits for a slot,
    its own deadline running; once one ends, calls run again."""
    calls = InProcessCompiles(max_running=2, progress_s=10)
    gate = threading.Event()
    for i in range(2):
        with pytest.raises(PastDeadline):
            calls.run(_blocked(gate, i), time.monotonic() + 0.05, lambda: None)
    ran = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(PastDeadline):
        calls.run(ran.set, t0 + 0.3, lambda: None)
    assert time.monotonic() - t0 >= 0.3 and not ran.is_set()  # it never started
    gate.set()
    assert calls.run(lambda: 3, time.monotonic() + 30, lambda: None) == 3


def test_in_process_errors_reach_the_caller():
    calls = InProcessCompiles(max_running=1, progress_s=10)

    def bad() -> int:
        raise GrammarError("no such rule")

    with pytest.raises(GrammarError, match="no such rule"):
        calls.run(bad, time.monotonic() + 30, lambda: None)
    assert calls.num_running == 0


def test_in_process_close_wakes_the_waiting_callers():
    calls = InProcessCompiles(max_running=1, progress_s=10)
    gate = threading.Event()
    running, r = _background(lambda: calls.run(_blocked(gate, 1), time.monotonic() + 60, str))
    while calls.num_running == 0:
        time.sleep(0.01)
    queued, q = _background(lambda: calls.run(lambda: 2, time.monotonic() + 60, str))
    time.sleep(0.1)
    t0 = time.monotonic()
    calls.close()
    running.join(10)
    queued.join(10)
    assert time.monotonic() - t0 < 5
    for box in (r, q):
        assert isinstance(box.get("error"), GrammarError)
        assert str(box["error"]) == "the engine is shutting down"
    with pytest.raises(GrammarError, match="shutting down"):
        calls.run(lambda: 3, time.monotonic() + 60, str)
    gate.set()


def test_in_process_service_close_does_not_wait_for_a_compile(qwen3):
    """A compile under way fails its requests at `close`, which returns at once; the
    compile runs on to its end on its daemon thread (a short one here)."""
    svc = CompileService(
        qwen3, CompileOptions(), tokenizer_info_for(qwen3), num_workers=0, timeout_s=60
    )
    props = ",".join(f'"p{i}": {{"type": "string"}}' for i in range(200))  # ~0.7 CPU-s
    f = svc.submit(
        GrammarSpec.of("json_schema", f'{{"type": "object", "properties": {{{props}}}}}')
    )
    while svc.num_pending and not f.running():
        time.sleep(0.01)
    t0 = time.monotonic()
    svc.close()
    assert time.monotonic() - t0 < 2
    with pytest.raises(GrammarError, match="shutting down"):
        f.result(10)
    with pytest.raises(GrammarError, match="shutting down"):
        svc.submit(GrammarSpec.of("regex", "after-close")).result(10)


def test_negative_workers_are_refused(qwen3):
    with pytest.raises(ValueError, match="--compile-workers must be 0 or more, not -1"):
        CompileService(qwen3, CompileOptions(), tokenizer_info_for(qwen3), num_workers=-1)
