"""Nothing one request carries ends the engine (issue 12.1).

A fault is injected at each stage of one request's life (admission, compile, start,
feeding its guide, mask fill (loop and batched), sampling, commit, finish) by wrapping
the real component of an in-process `EngineCore` (random model, real xgrammar, the
Qwen3 vocabulary). In each case that request alone ends, with an error that names the
stage, while other clients' requests beside it finish normally, exactly once each,
and the engine answers and serves afterwards. A failed forward pass ends the requests
of its step, and the engine goes on. Then hostile specs go over the wire to a real
engine process, with another client's requests running beside them.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections import defaultdict
from typing import Any

import jsonschema
import pytest

from engine_core.client import EngineClient
from engine_core.config import EngineConfig
from engine_core.engine import EngineCore
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output.config import StructuredOutputConfig
from tests.support.engine import collect

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
VICTIM_SCHEMA = {
    "type": "object",
    "properties": {"victim_field": {"type": "boolean"}},
    "required": ["victim_field"],
}
#: the victim's temperature: a sampler wrapper tells its row by it
VICTIM_TEMPERATURE = 0.8125


def _prompt(tok, text: str) -> list[int]:
    return tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def core(qwen3):
    c = EngineCore(
        EngineConfig(
            model="random",
            max_num_seqs=16,
            seed=7,
            structured_output=StructuredOutputConfig(compile_workers=1),
        ),
        qwen3,
    )
    yield c
    c.close()


@pytest.fixture(scope="module")
def prompts(qwen3):
    return {"victim": _prompt(qwen3, "victim"), "other": _prompt(qwen3, "hello there")}


class Injected(RuntimeError):
    pass


class FaultyMatcher:
    """A real matcher whose mask fill raises, in the loop and in xgrammar's batched
    fill alike (which reads its handle)."""

    def __init__(self, real) -> None:
        self._real = real

    @property
    def _handle(self):
        raise Injected("injected fault in the batched mask fill")

    def fill_next_token_bitmask(self, *args, **kwargs):
        raise Injected("injected fault in the mask fill")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class FaultyGuide:
    """A real guide with one fault: ``accept`` raises at output token ``accept_at``,
    or its matcher's fill raises."""

    def __init__(self, real, *, accept_at: int | None = None, fill: bool = False) -> None:
        self._real = real
        self._accept_at = accept_at
        self._fill = fill

    def accept(self, token_id: int, output_ids) -> None:
        if self._accept_at is not None and len(output_ids) >= self._accept_at:
            raise Injected("injected fault in accept")
        self._real.accept(token_id, output_ids)

    @property
    def matcher(self):
        m = self._real.matcher
        return FaultyMatcher(m) if self._fill and m is not None else m

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _faulty_guides(monkeypatch, core, victim_prompt: list[int], **faults) -> None:
    """The victim's guide (told by its prompt) gets ``faults``."""
    real = core.structured_output.make_guide

    def make_guide(grammar, *, prompt_token_ids, **kwargs):
        g = real(grammar, prompt_token_ids=prompt_token_ids, **kwargs)
        if list(prompt_token_ids) == victim_prompt:
            return FaultyGuide(g, **faults)
        return g

    monkeypatch.setattr(core.structured_output, "make_guide", make_guide)


def _bystanders(prompt: list[int], n: int = 6) -> list[tuple[bytes, EngineCoreRequest]]:
    out = []
    for i in range(n):
        spec = StructuredOutputSpec("json_schema", json.dumps(SCHEMA)) if i % 2 == 0 else None
        client = b"a" if i % 3 else b"b"
        out.append(
            (
                client,
                EngineCoreRequest(
                    f"other-{i}", prompt, SamplingParams(max_tokens=48, seed=100 + i), spec
                ),
            )
        )
    return out


def _victim(prompt: list[int], *, max_tokens: int = 48, schema: bool = True) -> EngineCoreRequest:
    spec = StructuredOutputSpec("json_schema", json.dumps(VICTIM_SCHEMA)) if schema else None
    return EngineCoreRequest(
        "victim",
        prompt,
        SamplingParams(max_tokens=max_tokens, temperature=VICTIM_TEMPERATURE, seed=1),
        spec,
    )


def _drive(core: EngineCore, submissions, timeout_s: float = 300) -> dict[tuple[bytes, str], list]:
    """Submit, step until the engine is idle; every output by (client, request id)."""
    import time

    got: dict[tuple[bytes, str], list] = defaultdict(list)

    def take(outs) -> None:
        for client, o in outs:
            got[(client, o.request_id)].append(o)

    for client, req in submissions:
        take(core.add_request(client, req))
    deadline = time.monotonic() + timeout_s
    while core.has_work:
        assert time.monotonic() < deadline, "the engine did not drain"
        if not core.has_runnable:
            time.sleep(0.01)  # a grammar is compiling
        take(core.step())
    return got


def _final(outs: list) -> Any:
    finals = [o for o in outs if o.finish_reason is not None]
    assert len(finals) == 1, f"{len(finals)} final outputs: {outs}"
    assert outs[-1] is finals[0]
    return finals[0]


def _check_bystanders(got, n: int = 6) -> None:
    """Each other request ended normally, once; a constrained one that stopped is a
    valid document."""
    for i in range(n):
        client = b"a" if i % 3 else b"b"
        outs = got[(client, f"other-{i}")]
        final = _final(outs)
        assert final.error is None, final.error
        assert final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        ids = [t for o in outs for t in o.new_token_ids]
        assert 0 < len(ids) <= 48


def _serves_after(core: EngineCore, prompt: list[int]) -> None:
    gc.collect()  # a caught fault's traceback and its frames form cycles until collected
    st = core.stats()
    assert (st.num_requests, st.num_running, st.num_waiting, st.num_guides) == (0, 0, 0, 0), st
    got = _drive(
        core,
        [
            (
                b"later",
                EngineCoreRequest(
                    "after",
                    prompt,
                    SamplingParams(max_tokens=8, seed=3),
                    StructuredOutputSpec("json_schema", json.dumps(SCHEMA)),
                ),
            )
        ],
    )
    final = _final(got[(b"later", "after")])
    assert final.error is None and final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


def _run_with_victim(core, prompts, victim: EngineCoreRequest):
    subs = _bystanders(prompts["other"])
    subs.insert(3, (b"victim-client", victim))
    got = _drive(core, subs)
    _check_bystanders(got)
    return _final(got[(b"victim-client", "victim")])


# ----- one stage at a time ------------------------------------------------------------


def test_a_fault_while_admitting(core, prompts, monkeypatch):
    import engine_core.engine as engine_module

    real = engine_module.check_request

    def check(req, *args):
        if req.request_id == "victim":
            raise Injected("injected fault in admission")
        return real(req, *args)

    monkeypatch.setattr(engine_module, "check_request", check)
    final = _run_with_victim(core, prompts, _victim(prompts["victim"]))
    assert final.finish_reason == FinishReason.ERROR
    assert "while admitting the request" in final.error and "Injected" in final.error
    _serves_after(core, prompts["other"])


def test_a_fault_in_the_compile_dispatcher(core, prompts, monkeypatch):
    """The round trip to the compile worker raises an error the service does not
    expect, for the victim's spec. That compile fails; the dispatcher thread lives on
    (with a new worker) for the next."""
    compiler = core.structured_output.compiler
    real = compiler._compile

    def compile_on_worker(worker, job, deadline):
        if "victim_field" in job.spec.value:
            raise TypeError("injected fault in the compile dispatcher")
        return real(worker, job, deadline)

    monkeypatch.setattr(compiler, "_compile", compile_on_worker)
    final = _run_with_victim(core, prompts, _victim(prompts["victim"]))
    assert final.finish_reason == FinishReason.ERROR
    assert "internal error while compiling" in final.error and "TypeError" in final.error
    monkeypatch.undo()
    _serves_after(core, prompts["other"])
    # the failed compile is not cached: the same spec compiles now
    ok = _drive(core, [(b"c", _victim(prompts["victim"], max_tokens=8))])
    assert _final(ok[(b"c", "victim")]).error is None


def test_a_fault_while_starting(core, prompts, monkeypatch):
    real = core.structured_output.make_guide

    def make_guide(grammar, *, prompt_token_ids, **kwargs):
        if list(prompt_token_ids) == prompts["victim"]:
            raise Injected("injected fault in making the guide")
        return real(grammar, prompt_token_ids=prompt_token_ids, **kwargs)

    monkeypatch.setattr(core.structured_output, "make_guide", make_guide)
    final = _run_with_victim(core, prompts, _victim(prompts["victim"]))
    assert final.finish_reason == FinishReason.ERROR
    assert "while starting the request" in final.error
    _serves_after(core, prompts["other"])


def test_a_fault_while_feeding_the_guide(core, prompts, monkeypatch):
    _faulty_guides(monkeypatch, core, prompts["victim"], accept_at=3)
    final = _run_with_victim(core, prompts, _victim(prompts["victim"]))
    assert final.finish_reason == FinishReason.ERROR
    assert "feeding its last token to its guide" in final.error
    _serves_after(core, prompts["other"])


@pytest.mark.parametrize("batched", [False, True], ids=["loop", "batched"])
def test_a_fault_in_the_mask_fill(core, prompts, monkeypatch, batched):
    """Below the batch threshold the fill loops over the matchers in Python; above it,
    one C++ call fills every row (and refuses the faulty matcher for all of them):
    either way only the victim's row is found at fault."""
    monkeypatch.setattr(core.structured_output.filler, "batch_threshold", 2 if batched else 999)
    _faulty_guides(monkeypatch, core, prompts["victim"], fill=True)
    final = _run_with_victim(core, prompts, _victim(prompts["victim"]))
    assert final.finish_reason == FinishReason.ERROR
    assert "filling its token mask" in final.error
    _serves_after(core, prompts["other"])


def test_a_fault_while_sampling(core, prompts, monkeypatch):
    real = core.sampler.sample
    calls = {"batch": 0}

    def sample(logits, batch, cons):
        if len(batch.temperature) > 1:
            calls["batch"] += 1
        if (batch.temperature == VICTIM_TEMPERATURE).any():
            raise Injected("injected fault in sampling")
        return real(logits, batch, cons)

    monkeypatch.setattr(core.sampler, "sample", sample)
    final = _run_with_victim(core, prompts, _victim(prompts["victim"]))
    assert final.finish_reason == FinishReason.ERROR
    assert "while sampling" in final.error
    assert calls["batch"] > 1  # after the victim left, whole batches were sampled again
    _serves_after(core, prompts["other"])


def test_a_fault_while_taking_the_token(core, prompts, monkeypatch):
    class FaultyIds(list):
        def append(self, tok) -> None:
            if len(self) >= 4:
                raise Injected("injected fault in commit")
            super().append(tok)

    real = core.structured_output.make_guide

    def make_guide(grammar, *, prompt_token_ids, **kwargs):
        if list(prompt_token_ids) == prompts["victim"]:
            core.requests[(b"victim-client", "victim")].output_ids = FaultyIds()
        return real(grammar, prompt_token_ids=prompt_token_ids, **kwargs)

    monkeypatch.setattr(core.structured_output, "make_guide", make_guide)
    final = _run_with_victim(core, prompts, _victim(prompts["victim"]))
    assert final.finish_reason == FinishReason.ERROR
    assert "taking its sampled token" in final.error
    _serves_after(core, prompts["other"])


def test_a_fault_while_finishing(core, prompts, monkeypatch):
    """The last token reaches the guide as the request finishes (max_tokens here); a
    guide that fails then turns the normal finish into an error, and the request
    still gets its one final output."""
    _faulty_guides(monkeypatch, core, prompts["victim"], accept_at=6)
    final = _run_with_victim(core, prompts, _victim(prompts["victim"], max_tokens=6))
    assert final.finish_reason == FinishReason.ERROR
    assert "while finishing the request" in final.error
    _serves_after(core, prompts["other"])


def test_a_fault_while_aborting_a_request_that_waits_for_its_grammar(core, prompts, monkeypatch):
    real_release = core.structured_output.release

    def release(spec, future):
        raise Injected("injected fault in releasing the grammar")

    monkeypatch.setattr(core.structured_output, "release", release)
    slow = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(400)}}
    req = EngineCoreRequest(
        "waiting",
        prompts["victim"],
        SamplingParams(max_tokens=4),
        StructuredOutputSpec("json_schema", json.dumps(slow)),
    )
    assert core.add_request(b"victim-client", req) == []
    ((client, out),) = core.abort(b"victim-client", ["waiting"])
    assert client == b"victim-client" and out.finish_reason == FinishReason.ABORT
    monkeypatch.setattr(core.structured_output, "release", real_release)
    got = _drive(core, _bystanders(prompts["other"]))
    _check_bystanders(got)
    _serves_after(core, prompts["other"])


def test_a_failed_forward_pass_ends_its_step_and_the_engine_goes_on(core, prompts, monkeypatch):
    real = core.runner.forward
    calls = {"n": 0}

    def forward(rows):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Injected("injected fault in the forward pass")
        return real(rows)

    monkeypatch.setattr(core.runner, "forward", forward)
    subs = _bystanders(prompts["other"])
    got = _drive(core, subs)
    finals = {key: _final(outs) for key, outs in got.items()}
    assert len(finals) == len(subs)
    failed = [f for f in finals.values() if f.finish_reason == FinishReason.ERROR]
    assert failed and all("forward pass" in f.error for f in failed)
    _serves_after(core, prompts["other"])


# ----- over the wire, to a real engine process --------------------------------------

HOSTILE = {
    "nested json_schema": StructuredOutputSpec(
        "json_schema", '{"allOf":[' * 1500 + "{}" + "]}" * 1500
    ),
    "nested choice": StructuredOutputSpec("choice", "[" * 1500 + "]" * 1500),
    "nested structural_tag": StructuredOutputSpec(
        "structural_tag", '{"a":' * 1500 + "1" + "}" * 1500
    ),
}


def test_hostile_specs_end_their_requests_and_the_engine_serves_everyone_else():
    async def body():
        engine = await EngineClient.spawn(EngineConfig(model="random", seed=9))
        other = await EngineClient.connect(engine.address)
        try:
            tok = engine.tokenizer()
            prompt = _prompt(tok, "hi")
            spec = StructuredOutputSpec("json_schema", json.dumps(SCHEMA))

            def normal(i: int) -> EngineCoreRequest:
                return EngineCoreRequest(
                    f"n{i}", prompt, SamplingParams(max_tokens=64, seed=i), spec if i % 2 else None
                )

            bystanders = [asyncio.create_task(collect(other, normal(i))) for i in range(8)]
            hostile = {
                name: asyncio.create_task(
                    collect(engine, EngineCoreRequest(name, prompt, SamplingParams(), s))
                )
                for name, s in HOSTILE.items()
            }
            bad = {name: await t for name, t in hostile.items()}
            good = await asyncio.gather(*bystanders)
            after = await asyncio.gather(engine.health(), other.health())
            again = await collect(engine, normal(100))
            return bad, good, after, again
        finally:
            await other.close()
            await engine.shutdown()

    bad, good, after, again = asyncio.run(body())
    for name, (_, final, finals) in bad.items():
        assert finals == 1
        assert final.finish_reason == FinishReason.ERROR, name
        assert "nested too deeply" in final.error, (name, final.error)
    for _, final, finals in good:
        assert finals == 1 and final.error is None
        assert final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert all(h.num_requests == 0 for h in after)
    assert again[1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


def test_constrained_bystanders_still_write_valid_documents(core, prompts, qwen3, monkeypatch):
    """Beside a victim whose sampling fails, the constrained rows sampled one by one
    in that step keep their masks: what they write parses and matches its schema."""
    real = core.sampler.sample

    def sample(logits, batch, cons):
        if (batch.temperature == VICTIM_TEMPERATURE).any():
            raise Injected("injected fault in sampling")
        return real(logits, batch, cons)

    monkeypatch.setattr(core.sampler, "sample", sample)
    subs = [
        (
            b"a",
            EngineCoreRequest(
                f"doc-{i}",
                prompts["other"],
                SamplingParams(max_tokens=200, seed=i),
                StructuredOutputSpec("json_schema", json.dumps(SCHEMA)),
            ),
        )
        for i in range(4)
    ]
    subs.insert(2, (b"victim-client", _victim(prompts["victim"], max_tokens=200)))
    got = _drive(core, subs)
    assert _final(got[(b"victim-client", "victim")]).finish_reason == FinishReason.ERROR
    stopped = 0
    for i in range(4):
        outs = got[(b"a", f"doc-{i}")]
        final = _final(outs)
        assert final.error is None
        if final.finish_reason == FinishReason.STOP:
            stopped += 1
            ids = [t for o in outs for t in o.new_token_ids][:-1]  # the stop token
            jsonschema.validate(json.loads(qwen3.decode(ids)), SCHEMA)
    assert stopped
