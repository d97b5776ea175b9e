"""Contradictory and unsupported schemas through the real engine (random-logits model,
compile workers, guides, masks): every output that finished is valid against the
schema as the user gave it; a schema that cannot be met or enforced ends its request
with an error that names the property or keyword; marker binding fails loudly.

Outputs must be valid UTF-8 (`tests.support.core_run.Finished.text`), and are read
with ``json.loads(..., strict=False)``: raw control characters inside strings are a
separate defect (issue 13.4: xgrammar's length-bounded strings); here the question is
whether the values meet the schema."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from engine_core.config import EngineConfig
from engine_core.engine import EngineCore
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output.config import StructuredOutputConfig
from tests.support.contradictions import contradictory_object, with_unsatisfiable_required
from tests.support.core_run import run_to_end

DOCUMENTS = 20
SEEDS_PER_DOCUMENT = 3
MAX_TOKENS = 384


@pytest.fixture(scope="module")
def core(qwen3):
    c = EngineCore(
        EngineConfig(
            model="random",
            max_num_seqs=128,
            structured_output=StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
            seed=7,
        ),
        qwen3,
    )
    yield c
    c.close()


def _prompt(core) -> list[int]:
    return core.tokenizer.encode("Answer with the JSON object the schema describes.")


def _request(core, rid: str, spec: StructuredOutputSpec, seed: int) -> EngineCoreRequest:
    return EngineCoreRequest(
        rid, _prompt(core), SamplingParams(max_tokens=MAX_TOKENS, seed=seed), spec
    )


def test_contradictory_schemas_give_valid_outputs(core):
    rng = random.Random(2024)
    cases, requests = [], []
    for d in range(DOCUMENTS):
        schema = contradictory_object(rng)
        spec = StructuredOutputSpec("json_schema", json.dumps(schema))
        for s in range(SEEDS_PER_DOCUMENT):
            cases.append(schema)
            requests.append(_request(core, f"doc{d}-{s}", spec, seed=d * 100 + s))
    results = run_to_end(core, requests)
    stopped = 0
    for schema, req, res in zip(cases, requests, results, strict=True):
        assert res.reason in (FinishReason.STOP, FinishReason.LENGTH), (req.request_id, res.error)
        if res.reason != FinishReason.STOP:
            continue
        stopped += 1
        jsonschema.validate(json.loads(res.text(core.tokenizer), strict=False), schema)
    print(f"{stopped}/{len(requests)} finished with stop, all valid")
    assert stopped >= 0.9 * len(requests)


def test_the_engine_refuses_a_required_property_no_value_fits(core):
    rng = random.Random(77)
    requests, paths = [], []
    for i in range(12):
        schema, path = with_unsatisfiable_required(rng, contradictory_object(rng))
        spec = StructuredOutputSpec("json_schema", json.dumps(schema))
        requests.append(_request(core, f"bad{i}", spec, seed=i))
        paths.append(path)
    for res, path in zip(run_to_end(core, requests), paths, strict=True):
        assert res.reason == FinishReason.ERROR and not res.token_ids
        assert res.error.startswith(f"response_format schema: the required property '{path}"), (
            res.error
        )
        assert "admits no value" in res.error


TAGS = {"type": "array", "items": {"type": "string", "maxLength": 4}, "uniqueItems": True}


def test_unsupported_keywords_are_refused_or_ignored_on_request(core):
    schema = {"type": "object", "properties": {"tags": TAGS}, "required": ["tags"]}
    strict = StructuredOutputSpec("json_schema", json.dumps(schema))
    lenient = StructuredOutputSpec(
        "json_schema", json.dumps(schema), ignore_unsupported_keywords=True
    )
    refused, *ignored = run_to_end(
        core,
        [_request(core, "strict", strict, 1)]
        + [_request(core, f"lenient{s}", lenient, s) for s in range(8)],
    )
    assert refused.reason == FinishReason.ERROR
    assert refused.error.startswith(
        "response_format schema: uniqueItems at 'tags' (its items are not a set of at most "
        "6 values) cannot be enforced"
    ), refused.error
    without = {
        **schema,
        "properties": {"tags": {k: v for k, v in TAGS.items() if k != "uniqueItems"}},
    }
    for res in ignored:
        assert res.reason in (FinishReason.STOP, FinishReason.LENGTH), res.error
        if res.reason == FinishReason.STOP:
            jsonschema.validate(json.loads(res.text(core.tokenizer), strict=False), without)


def _tool_call_tag(schema: dict) -> dict:
    return {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<tool_call>\n",
            "content": {"type": "json_schema", "json_schema": schema},
            "end": "\n</tool_call>",
        },
    }


def test_json_schemas_inside_structural_tags_are_normalized(core):
    rng = random.Random(5)
    schemas = [contradictory_object(rng) for _ in range(10)]
    requests = [
        _request(
            core,
            f"tag{i}-{s}",
            StructuredOutputSpec("structural_tag", json.dumps(_tool_call_tag(sc))),
            s,
        )
        for i, sc in enumerate(schemas)
        for s in range(3)
    ]
    results = run_to_end(core, requests)
    stopped = 0
    for k, res in enumerate(results):
        assert res.reason in (FinishReason.STOP, FinishReason.LENGTH), res.error
        if res.reason != FinishReason.STOP:
            continue
        stopped += 1
        text = res.text(core.tokenizer)
        assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>"), text
        body = text[len("<tool_call>\n") : -len("\n</tool_call>")]
        jsonschema.validate(json.loads(body, strict=False), schemas[k // 3])
    assert stopped >= 0.9 * len(requests)
    bad, path = with_unsatisfiable_required(rng, schemas[0])
    (res,) = run_to_end(
        core,
        [
            _request(
                core,
                "tag-bad",
                StructuredOutputSpec("structural_tag", json.dumps(_tool_call_tag(bad))),
                0,
            )
        ],
    )
    assert res.reason == FinishReason.ERROR
    assert f"the required property '{path}" in res.error and "structural_tag" in res.error


def test_a_tag_the_marker_binder_cannot_rewrite_is_an_error_not_text(core):
    """Its end is a list with a marker among the alternatives: xgrammar's binder
    refuses it, and the request must end with that error instead of running with
    its markers matched as text."""
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<tool_call>",
            "content": {"type": "any_text"},
            "end": ["</tool_call>", "\n\n"],
        },
    }
    (res,) = run_to_end(
        core,
        [_request(core, "unbindable", StructuredOutputSpec("structural_tag", json.dumps(tag)), 0)],
    )
    assert res.reason == FinishReason.ERROR and not res.token_ids
    assert "markers cannot all be bound to their special tokens" in res.error, res.error


def test_the_engine_will_not_start_without_marker_binding(qwen3, monkeypatch):
    """An xgrammar without the binder (simulated: the one installed, with it removed)
    must stop engine construction, not leave markers as text."""
    import xgrammar.builtin_structural_tag as bst

    monkeypatch.delattr(bst, "_bind_marker_tokens")
    with pytest.raises(RuntimeError, match="cannot bind markers to special tokens"):
        EngineCore(
            EngineConfig(
                model="random",
                max_num_seqs=2,
                structured_output=StructuredOutputConfig(compile_workers=1),
            ),
            qwen3,
        )
