"""The Hugging Face runner: a tiny model built here, loaded from its directory by the
engine through the same code that loads a real model."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from tests.support.engine import EngineHarness, collect
from tests.support.tiny_model import build_tiny_model
from tokenization import load_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def engine(model_dir):
    h = EngineHarness(EngineConfig(model=str(model_dir), reasoning_parser="qwen3", device="cpu"))
    yield h
    h.close()


def _prompt(tok):
    return tok.encode("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_handshake_reports_the_model(engine, model_dir):
    hs = engine.client.handshake
    assert hs.tokenizer == str(model_dir)
    assert hs.vocab_rows == 448


def test_greedy_matches_transformers_generate(engine, model_dir):
    """The KV-cached incremental decoding gives the same tokens as transformers'
    own greedy generation."""
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(str(model_dir))
    prompt = _prompt(tok)
    req = EngineCoreRequest(
        "greedy", prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    )
    ids, final, _ = engine.run(lambda: collect(engine.client, req))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    with torch.inference_mode():
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            min_new_tokens=24,
        )
    assert ids == ref[0, len(prompt) :].tolist()
    assert final.finish_reason == FinishReason.LENGTH


def test_constrained_generation_is_valid(engine, model_dir):
    tok = load_tokenizer(str(model_dir))
    prompt = _prompt(tok)
    choices = ["sunny", "rain", "snow and ice"]
    spec = StructuredOutputSpec("choice", json.dumps(choices))

    async def body():
        reqs = [
            EngineCoreRequest(
                f"ch{i}", prompt, SamplingParams(max_tokens=40, seed=i), spec, reasoning_ended=True
            )
            for i in range(8)
        ]
        return await asyncio.gather(*(collect(engine.client, r) for r in reqs))

    for ids, final, finals in engine.run(body):
        assert finals == 1 and final.finish_reason == FinishReason.STOP, final.error
        assert tok.decode(ids[:-1]) in choices


def test_seeded_sampling_reproduces(engine, model_dir):
    tok = load_tokenizer(str(model_dir))
    sp = SamplingParams(max_tokens=20, seed=77, temperature=1.0, ignore_eos=True)
    a = engine.run(lambda: collect(engine.client, EngineCoreRequest("r1", _prompt(tok), sp)))[0]
    b = engine.run(lambda: collect(engine.client, EngineCoreRequest("r2", _prompt(tok), sp)))[0]
    assert a == b and len(a) == 20
