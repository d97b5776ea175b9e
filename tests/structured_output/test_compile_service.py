"""Compilation off the scheduling thread: cache, sharing, time limit, size limit."""

from __future__ import annotations

import json
import time

import pytest

from structured_output import CompileOptions, GrammarError, GrammarSpec, tokenizer_info_for
from structured_output.compile_service import CompileService

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
SLOW = json.dumps(
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1500)}}
)


@pytest.fixture(scope="module")
def service(qwen3):
    svc = CompileService(
        qwen3,
        CompileOptions(max_spec_bytes=200_000),
        tokenizer_info_for(qwen3),
        num_workers=1,
        timeout_s=1.0,
        cache_bytes=64 << 20,
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


def test_time_limit_kills_the_compile_and_the_service_recovers(service):
    t0 = time.monotonic()
    with pytest.raises(GrammarError, match="time limit of 1 s"):
        service.submit(GrammarSpec.of("json_schema", SLOW)).result(120)
    assert time.monotonic() - t0 < 30
    assert service.num_timeouts >= 1
    # the worker was replaced: the next compile works
    service.submit(GrammarSpec.of("regex", "after-timeout[0-9]")).result(120)
