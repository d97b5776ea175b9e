"""A model directory served by the real engine process with the batched runner.

Requests of mixed prompt lengths join the batch one after another while others run
(prompts longer than the token budget are prefilled over several steps), some under a
JSON schema (greedy within the grammar's mask), one aborted mid-way, some finishing
while others go on; every request's tokens must equal those of transformers' own
``generate`` on that request alone (with the same grammar's masks applied through a
logits processor for the constrained ones). float64, for the reason given in
``test_hf_runner.py``.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch

from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output import GrammarSpec
from structured_output.config import StructuredOutputConfig
from structured_output.local import LocalCompiler
from tests.support.engine import EngineHarness, collect
from tests.support.tiny_model import (
    ARCHS,
    build_model,
    build_tiny_model,
    load_reference,
    reference_generate,
)
from tokenization import load_tokenizer

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["unit", "days"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["city", "ok"],
        "additionalProperties": False,
    },
]


class MaskProcessor:
    """A transformers logits processor applying a grammar's masks to one sequence (any
    dtype: the mask comes from xgrammar's apply on a float32 row of zeros)."""

    def __init__(self, matcher, vocab_rows: int) -> None:
        import xgrammar as xgr

        self.matcher = matcher
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_rows)
        self.zeros = torch.zeros((1, vocab_rows))
        self.started = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import xgrammar as xgr

        if self.started:
            assert self.matcher.accept_token(int(input_ids[0, -1]))
        self.started = True
        self.matcher.fill_next_token_bitmask(self.bitmask)
        row = self.zeros.clone()
        xgr.apply_token_bitmask_inplace(row, self.bitmask)
        return scores.masked_fill(torch.isinf(row), float("-inf"))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3")


@pytest.fixture(
    scope="module",
    params=[pytest.param(a, marks=[pytest.mark.slow] if a != "qwen3" else []) for a in ARCHS],
)
def served(request, tmp_path_factory):
    """The engine on a model of each architecture (beyond qwen3: ``-m slow``; the
    runner tests cover every architecture in the default run)."""
    path = build_model(tmp_path_factory.mktemp(request.param) / "m", request.param, seed=9)
    config = EngineConfig(
        model=str(path),
        tokenizer="qwen3",
        device="cpu",
        dtype="float64",
        max_num_seqs=4,
        max_num_batched_tokens=16,
        structured_output=StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
    )
    h = EngineHarness(config)
    yield h, path
    h.close()


def test_batch_matches_generate_with_and_without_grammar(served, tok):
    engine, path = served
    rng = random.Random(4)
    lengths = [6, 41, 2, 23, 9, 30]
    print("prompt lengths", lengths)
    prompts = [[rng.randrange(151643) for _ in range(n)] for n in lengths]
    schema = {1: SCHEMAS[0], 3: SCHEMAS[1], 4: SCHEMAS[0]}
    max_tokens = [9, 40, 6, 40, 40, 8]
    abort_after = {5: 3}  # request 5 is aborted once it has 3 tokens

    def request(i: int) -> EngineCoreRequest:
        spec = StructuredOutputSpec("json_schema", json.dumps(schema[i])) if i in schema else None
        sp = SamplingParams(max_tokens=max_tokens[i], temperature=0.0, ignore_eos=i not in schema)
        return EngineCoreRequest(f"r{i}", prompts[i], sp, spec)

    async def body():
        started = [asyncio.Event() for _ in prompts]
        results = {}

        async def run(i: int) -> None:
            if i:
                await started[i - 1].wait()  # join once the previous one is running
            ids, final, finals = [], None, 0
            async for out in engine.client.generate(request(i)):
                ids += out.new_token_ids
                if ids:
                    started[i].set()
                if i in abort_after and len(ids) >= abort_after[i] and not out.finished:
                    await engine.client.abort(f"r{i}")
                if out.finished:
                    final, finals = out, finals + 1
            started[i].set()
            results[i] = (ids, final, finals)

        await asyncio.gather(*(run(i) for i in range(len(prompts))))
        return results

    results = engine.run(body)
    reference = load_reference(path)
    compiler = LocalCompiler(tok)
    for i, (ids, final, finals) in sorted(results.items()):
        assert finals == 1, i
        if i in abort_after:
            assert final.finish_reason == FinishReason.ABORT
            assert abort_after[i] <= len(ids) < max_tokens[i]
            assert ids == reference_generate(reference, prompts[i], len(ids))
        elif i in schema:
            grammar = compiler.compile(GrammarSpec.of("json_schema", json.dumps(schema[i])))
            proc = MaskProcessor(compiler.matcher(grammar), tok.vocab_rows)
            stops = list(tok.stop_token_ids)
            ref = reference_generate(
                reference, prompts[i], max_tokens[i], stop_ids=stops, logits_processor=proc
            )
            assert ids == ref, i
            if final.finish_reason == FinishReason.STOP:
                json.loads(tok.decode(ids[:-1]))
        else:
            assert final.finish_reason == FinishReason.LENGTH
            assert ids == reference_generate(reference, prompts[i], max_tokens[i]), i
    # at least one constrained request ended on its grammar while others ran on
    assert any(results[i][1].finish_reason == FinishReason.STOP for i in schema)


# ----- a model directory with its own tokenizer (a small BPE trained here) ----------------


@pytest.fixture(scope="module")
def own_tokenizer(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    h = EngineHarness(
        EngineConfig(
            model=str(path),
            reasoning_parser="qwen3",
            device="cpu",
            structured_output=StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
        )
    )
    yield h, path
    h.close()


def _prompt(tok):
    return tok.encode("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_handshake_reports_the_model(own_tokenizer):
    engine, path = own_tokenizer
    hs = engine.client.handshake
    assert hs.tokenizer == str(path)
    assert hs.vocab_rows == 448


def test_constrained_generation_is_valid(own_tokenizer):
    engine, path = own_tokenizer
    tok = load_tokenizer(str(path))
    choices = ["sunny", "rain", "snow and ice"]
    spec = StructuredOutputSpec("choice", json.dumps(choices))

    async def body():
        reqs = [
            EngineCoreRequest(
                f"ch{i}",
                _prompt(tok),
                SamplingParams(max_tokens=40, seed=i),
                spec,
                reasoning_ended=True,
            )
            for i in range(8)
        ]
        return await asyncio.gather(*(collect(engine.client, r) for r in reqs))

    for ids, final, finals in engine.run(body):
        assert finals == 1 and final.finish_reason == FinishReason.STOP, final.error
        assert tok.decode(ids[:-1]) in choices


def test_seeded_sampling_reproduces(own_tokenizer):
    engine, path = own_tokenizer
    tok = load_tokenizer(str(path))
    sp = SamplingParams(max_tokens=20, seed=77, temperature=1.0, ignore_eos=True)
    a = engine.run(lambda: collect(engine.client, EngineCoreRequest("r1", _prompt(tok), sp)))[0]
    b = engine.run(lambda: collect(engine.client, EngineCoreRequest("r2", _prompt(tok), sp)))[0]
    assert a == b and len(a) == 20
