"""Structured outputs under an adversarial model: the random-logits model, 200 seeds
per kind of grammar (``-m slow``; the default run takes the first 48 of them). Every
output that finished with "stop" must be valid: its bytes decode as strict UTF-8 (no
encoded surrogates, which xgrammar's character classes admit and the engine's guard
keeps out), JSON parses with a strict parser, and the value is valid for its grammar;
at least 90% must finish with "stop" within max_tokens (the model favours tokens that
close strings and structures, so it ends, but is otherwise random)."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest

from bench.states import REQUIRED_SCHEMA, TOOLS, WEATHER
from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from tests.support.engine import NO_WORKERS, EngineHarness, collect
from tests.support.grammars import ARITHMETIC, hermes_calls_valid, hermes_tag, is_arithmetic
from tests.support.prompts import chat_prompt

#: the full sweep (``-m slow``) and the default run's share of it, per kind of grammar
SEEDS = 200
CI_SEEDS = 48
MAX_TOKENS = 384
PROMPT = chat_prompt()

REGEX = r"[A-Z]{2}-\d{3,5}(\.[a-z]{1,4})?"
CHOICES = ["alpha", "beta", "gamma delta", "ε-ζ"]


def strict_json(text: str):
    """``text`` parsed, and the value written back out as UTF-8: a string holding a
    lone surrogate escape (``\\ud800``), which strict parsers refuse, fails here."""
    value = json.loads(text)
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    return value


CASES = {
    "one_tool_schema": (
        StructuredOutputSpec("json_schema", json.dumps(WEATHER)),
        lambda t: jsonschema.validate(strict_json(t), WEATHER) is None,
    ),
    "json_object": (
        StructuredOutputSpec("json_object", ""),
        lambda t: isinstance(strict_json(t), dict),
    ),  # free-form: the random model nests as often as it closes (see FINISHED)
    "required_8_tools_schema": (
        StructuredOutputSpec("json_schema", json.dumps(REQUIRED_SCHEMA)),
        lambda t: jsonschema.validate(strict_json(t), REQUIRED_SCHEMA) is None,
    ),
    "hermes_structural_tag": (
        StructuredOutputSpec("structural_tag", json.dumps(hermes_tag(TOOLS))),
        lambda t: hermes_calls_valid(t, TOOLS),
    ),
    "regex": (StructuredOutputSpec("regex", REGEX), lambda t: re.fullmatch(REGEX, t) is not None),
    "choice": (StructuredOutputSpec("choice", json.dumps(CHOICES)), lambda t: t in CHOICES),
    "ebnf": (StructuredOutputSpec("grammar", ARITHMETIC), is_arithmetic),
}


#: the share that must finish with "stop"; a free-form object may nest without end, and
#: about one in five random ones is still open after MAX_TOKENS
FINISHED = {"json_object": 0.7}


@pytest.fixture(scope="module")
def engine():
    h = EngineHarness(
        EngineConfig(model="random", max_num_seqs=256, seed=3, structured_output=NO_WORKERS)
    )
    yield h
    h.close()


@pytest.mark.parametrize("case", list(CASES))
def test_random_model_outputs_are_valid(engine, case):
    _check(engine, case, CI_SEEDS)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_random_model_outputs_are_valid_full(engine, case):
    _check(engine, case, SEEDS)


def _check(engine: EngineHarness, case: str, seeds: int) -> None:
    spec, valid = CASES[case]
    tok = engine.client.tokenizer()

    async def body():
        reqs = [
            EngineCoreRequest(
                f"{case}-{s}", PROMPT, SamplingParams(max_tokens=MAX_TOKENS, seed=s), spec
            )
            for s in range(seeds)
        ]
        return await asyncio.gather(*(collect(engine.client, r) for r in reqs))

    results = engine.run(body)
    stopped = invalid = 0
    for seed, (ids, final, finals) in enumerate(results):
        assert finals == 1
        assert final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), final.error
        if final.finish_reason != FinishReason.STOP:
            continue
        stopped += 1
        assert ids[-1] in tok.stop_token_ids
        data = tok.decode_bytes(ids[:-1])
        try:
            text = data.decode("utf-8")  # strict: an encoded surrogate fails here
            ok = valid(text)
        except (ValueError, jsonschema.ValidationError):
            text = data.decode("utf-8", errors="backslashreplace")
            ok = False
        if not ok:
            invalid += 1
            print(f"seed {seed}: invalid output {text!r}")
    print(f"{case}: {stopped}/{seeds} finished with stop, {invalid} invalid")
    assert invalid == 0
    assert stopped >= FINISHED.get(case, 0.9) * seeds
