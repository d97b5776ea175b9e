"""``--compile-workers 0`` in a real engine: grammars compile in the engine process
itself (no worker process is started) and constrain outputs, under the limits the
workers keep: a compile past the time limit fails its own request with the workers'
message while the other requests go on, a grammar over the size limit is refused, and
a shutdown with a compile under way does not wait for it."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import jsonschema
import pytest

from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output.config import StructuredOutputConfig
from tests.support.engine import EngineHarness, collect
from tests.support.prompts import chat_prompt

COMPILE_TIMEOUT_S = 3
#: tens of CPU-seconds to compile (the engine's exit stops it)
SLOW = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1500)}}
#: 1.6 MiB once compiled, over the 1 MiB limit, in a fraction of a second
BIG = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(100)}}
PROMPT = chat_prompt()


@pytest.fixture(scope="module")
def engine():
    h = EngineHarness(
        EngineConfig(
            model="random",
            max_num_seqs=32,
            seed=7,
            structured_output=StructuredOutputConfig(
                compile_workers=0,
                compile_timeout_s=COMPILE_TIMEOUT_S,
                max_compiled_grammar_mb=1,
            ),
        )
    )
    yield h
    h.close()


def _schema(i: int) -> dict:
    """A small schema of its own per ``i`` (so that no two share a compile)."""
    return {
        "type": "object",
        "properties": {f"city{i}": {"type": "string"}, "days": {"type": "integer"}},
        "required": [f"city{i}", "days"],
        "additionalProperties": False,
    }


def _request(rid: str, spec: StructuredOutputSpec | None, seed: int = 0) -> EngineCoreRequest:
    return EngineCoreRequest(rid, PROMPT, SamplingParams(max_tokens=300, seed=seed), spec)


def _json(schema: dict) -> StructuredOutputSpec:
    return StructuredOutputSpec("json_schema", json.dumps(schema))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that has just ended
            pass
    return out


def _check_valid(engine: EngineHarness, ids: list[int], final, schema: dict) -> None:
    assert final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), final.error
    if final.finish_reason == FinishReason.STOP:
        text = engine.client.tokenizer().decode(ids[:-1])
        jsonschema.validate(json.loads(text), schema)


def test_grammars_compile_in_the_engine_and_constrain_outputs(engine):
    assert engine.client.proc is not None
    assert _children(engine.client.proc.pid) == []  # no compile worker, ever started
    regex = StructuredOutputSpec("regex", r"(yes|no), [0-9]{2,4}")

    async def body():
        jobs = [collect(engine.client, _request(f"j{i}", _json(_schema(i)), i)) for i in range(6)]
        jobs.append(collect(engine.client, _request("r", regex)))
        return await asyncio.gather(*jobs)

    results = engine.run(body)
    stopped = 0
    for i, (ids, final, finals) in enumerate(results[:-1]):
        assert finals == 1
        _check_valid(engine, ids, final, _schema(i))
        stopped += final.finish_reason == FinishReason.STOP
    assert stopped >= 3  # the random model is made to end: most outputs are whole
    ids, final, _ = results[-1]
    assert final.finish_reason == FinishReason.STOP
    assert re.fullmatch(r"(yes|no), [0-9]{2,4}", engine.client.tokenizer().decode(ids[:-1]))
    health = engine.run(engine.client.health)
    assert health.num_compiled_grammars >= 7 and health.num_compiling == 0
    assert _children(engine.client.proc.pid) == []


def test_a_grammar_over_the_size_limit_is_refused(engine):
    async def body():
        return await asyncio.gather(
            collect(engine.client, _request("big", _json(BIG))),
            collect(engine.client, _request("small", _json(_schema(300)), 1)),
        )

    (ids, final, finals), (small_ids, small, _) = engine.run(body)
    assert finals == 1 and final.finish_reason == FinishReason.ERROR and ids == []
    assert final.error == (
        "the compiled grammar is too large: 1 MiB in memory, over the limit of 1 MiB"
    )
    _check_valid(engine, small_ids, small, _schema(300))


def test_a_compile_past_the_time_limit_fails_its_request_while_others_go_on(engine):
    async def body():
        t0 = time.monotonic()
        slow = asyncio.create_task(collect(engine.client, _request("slow", _json(SLOW))))
        others = [
            collect(engine.client, _request(f"t{i}", _json(_schema(100 + i)), i)) for i in range(4)
        ]
        others.append(collect(engine.client, _request("free", None, 9)))
        done = await asyncio.gather(*others)
        ids, final, finals = await slow
        took = time.monotonic() - t0
        # new grammars compile while the one past its limit runs on
        after = await collect(engine.client, _request("after", _json(_schema(200)), 3))
        return done, (ids, final, finals, took), after

    done, (ids, final, finals, took), after = engine.run(body)
    assert finals == 1 and final.finish_reason == FinishReason.ERROR and ids == []
    # word for word what a worker's time limit gives
    assert (
        final.error == f"json_schema compilation exceeded the time limit of {COMPILE_TIMEOUT_S} s"
    )
    assert COMPILE_TIMEOUT_S <= took < COMPILE_TIMEOUT_S + 30
    for i, (ids, out, finals) in enumerate(done[:-1]):
        assert finals == 1
        _check_valid(engine, ids, out, _schema(100 + i))
    assert done[-1][1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    ids, out, _ = after
    _check_valid(engine, ids, out, _schema(200))


def test_a_shutdown_does_not_wait_for_a_compile_under_way(engine):
    """Last: it stops the module's engine. A compile cannot be stopped; the engine's
    exit ends it."""

    async def body():
        slow = asyncio.create_task(collect(engine.client, _request("slow-at-exit", _json(SLOW))))
        while (await engine.client.health()).num_compiling == 0:
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await engine.client.shutdown(timeout_s=60)
        took = time.monotonic() - t0
        return took, await slow

    took, (ids, final, finals) = engine.run(body)
    assert engine.client.proc.returncode == 0  # it exited by itself, not terminated
    assert took < 15
    assert finals == 1 and final.finish_reason in (FinishReason.ERROR, FinishReason.ABORT)
