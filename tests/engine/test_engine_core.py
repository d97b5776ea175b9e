"""EngineCore driven in process (no sockets), for what is easier to set up here."""

from __future__ import annotations

import json
import time

import pytest

from engine_core.config import EngineConfig
from engine_core.engine import EngineCore
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output.config import StructuredOutputConfig
from tests.support.prompts import chat_prompt

PROMPT = chat_prompt()


@pytest.fixture(scope="module")
def core(qwen3):
    config = EngineConfig(
        model="random", max_num_seqs=8, structured_output=StructuredOutputConfig(compile_workers=0)
    )
    c = EngineCore(config, qwen3)
    yield c
    c.close()


def _run_all(core, timeout_s=120.0):
    outs = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not core.has_work:
            return outs
        if not core.has_runnable:  # a grammar is compiling
            time.sleep(0.01)
        outs += core.step()
    raise AssertionError("the engine did not drain")


def test_aborting_one_of_two_requests_sharing_a_compile(core):
    schema = {
        "type": "object",
        "properties": {"shared": {"type": "integer"}},
        "required": ["shared"],
    }
    spec = StructuredOutputSpec("json_schema", json.dumps(schema))
    for rid in ("a", "b"):
        assert (
            core.add_request(
                b"c", EngineCoreRequest(rid, PROMPT, SamplingParams(max_tokens=50), spec)
            )
            == []
        )
    aborted = core.abort(b"c", ["a"])
    assert [o.finish_reason for _, o in aborted] == [FinishReason.ABORT]
    finals = [o for _, o in _run_all(core) if o.finished]
    assert [(o.request_id, o.finish_reason) for o in finals] == [("b", FinishReason.STOP)]


def test_duplicate_and_unknown_ids(core):
    req = EngineCoreRequest("dup", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True))
    assert core.add_request(b"c", req) == []
    ((client, out),) = core.add_request(b"c", req)
    assert out.finish_reason == FinishReason.ERROR and "already in use" in out.error
    assert core.add_request(b"other-client", req) == []  # ids are per client
    assert core.abort(b"c", ["never-seen"]) == []
    _run_all(core)
    assert core.add_request(b"c", req) == []  # reusable once finished
    _run_all(core)
