"""The README's table of JSON Schema keywords, held against the code.

Every keyword the table says is enforced has schemas here that use it (the case list
must cover the table exactly); each is generated through the real engine with the
random-logits model, and every output that finished must be valid against the schema
as written (jsonschema, the draft named by ``$schema``) and valid UTF-8. Every keyword
the table says is refused is refused by the engine, naming it. ``-m slow`` runs more
seeds."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from engine_core.config import EngineConfig
from engine_core.engine import EngineCore
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output.config import StructuredOutputConfig
from structured_output.schema_keywords import ENFORCED, REFUSED, readme_table
from tests.structured_output.test_json_schemas import REFUSED_VALUES
from tests.support.core_run import run_to_end

SEEDS = 4
SLOW_SEEDS = 40
MAX_TOKENS = 256
DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"


def _obj(props: dict, required: list[str] | None = None, **more) -> dict:
    out = {"type": "object", "properties": props, **more}
    if required is not None:
        out["required"] = required
    return out


NODE = {
    "type": "object",
    "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
    },
    "required": ["v", "next"],
}

#: keyword -> schemas that use it
CASES: dict[str, list[dict]] = {
    "type": [{"type": ["integer", "string"]}, _obj({"n": {"type": "null"}}, ["n"])],
    "enum": [_obj({"e": {"enum": ["a", 1, None, [1, "x"], {"k": 2}]}}, ["e"])],
    "const": [_obj({"c": {"const": {"x": [1, "y"]}}, "d": {"const": 2.5}}, ["c", "d"])],
    "properties": [_obj({"a": _obj({"b": {"type": "boolean"}}, ["b"])}, ["a"])],
    "required": [
        _obj({"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 3}}, ["b"]),
        _obj({"a": {"type": "string", "maxLength": 4, "required": True}}),
        {"type": "object", "required": ["z"], "additionalProperties": {"type": "integer"}},
    ],
    "additionalProperties": [
        _obj({"a": {"type": "integer"}}, ["a"], additionalProperties={"type": "boolean"}),
        _obj({"a": {"type": "integer"}}, additionalProperties=False, minProperties=1),
    ],
    "patternProperties": [
        {
            "type": "object",
            "patternProperties": {"^x_[a-z]$": {"type": "integer", "minimum": 0}},
            "additionalProperties": False,
            "minProperties": 1,
        },
        _obj({"x_a": {"type": "integer"}}, ["x_a"], patternProperties={"^x_": {"minimum": 5}}),
    ],
    "propertyNames": [
        {
            "type": "object",
            "propertyNames": {"pattern": "^[a-c]{2}$"},
            "additionalProperties": {"type": "integer"},
            "minProperties": 1,
        },
        _obj(
            {"too long": {"type": "integer"}, "ok": {"type": "integer"}},
            propertyNames={"maxLength": 3},
        ),
    ],
    "minProperties": [
        {"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 2}
    ],
    "maxProperties": [
        {
            "type": "object",
            "additionalProperties": {"type": "boolean"},
            "minProperties": 1,
            "maxProperties": 2,
        }
    ],
    "unevaluatedProperties": [
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "allOf": [{"properties": {"b": {"type": "string", "maxLength": 3}}}],
            "unevaluatedProperties": False,
            "minProperties": 1,
        }
    ],
    "items": [
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1},
        {"type": "array", "items": False},
        {
            "$schema": DRAFT7,
            "type": "array",
            "items": [{"type": "string", "maxLength": 2}, {"type": "integer"}],
            "additionalItems": False,
            "minItems": 2,
        },
    ],
    "prefixItems": [
        {
            "type": "array",
            "prefixItems": [{"const": "x"}, {"type": "boolean"}],
            "items": {"type": "null"},
            "maxItems": 4,
        }
    ],
    "additionalItems": [
        {
            "$schema": DRAFT7,
            "type": "array",
            "items": [{"type": "boolean"}],
            "additionalItems": {"type": "integer", "maximum": 0},
            "minItems": 2,
        }
    ],
    "unevaluatedItems": [
        {
            "type": "array",
            "prefixItems": [{"type": "string", "maxLength": 2}],
            "unevaluatedItems": {"type": "integer"},
            "minItems": 2,
        }
    ],
    "minItems": [{"type": "array", "items": {"type": "boolean"}, "minItems": 3}],
    "maxItems": [{"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2}],
    "uniqueItems": [
        {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True, "minItems": 2},
        {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True},
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 1},
    ],
    "minimum": [
        {"type": "integer", "minimum": -5, "maximum": 12},
        {"type": "number", "minimum": 0.25, "maximum": 0.75},
    ],
    "maximum": [{"type": "number", "maximum": -1.5}, {"type": "integer", "maximum": 3.7}],
    "exclusiveMinimum": [
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        {"$schema": DRAFT4, "type": "integer", "minimum": 1, "exclusiveMinimum": True},
    ],
    "exclusiveMaximum": [
        {"type": "integer", "exclusiveMinimum": 2.5, "exclusiveMaximum": 6},
        {"$schema": DRAFT4, "type": "number", "maximum": 2, "exclusiveMaximum": True},
    ],
    "multipleOf": [
        {"type": "integer", "multipleOf": 7},
        {"type": "integer", "multipleOf": 3, "minimum": 10, "maximum": 100},
        {"type": "number", "multipleOf": 5},
    ],
    "minLength": [
        {"type": "string", "minLength": 3},
        {"type": "string", "pattern": "^[a-z]{2,3}$", "minLength": 2},
    ],
    "maxLength": [
        {"type": "string", "minLength": 1, "maxLength": 4},
        {"type": "string", "pattern": "^[A-Z]{3}$", "maxLength": 3},
    ],
    "pattern": [
        {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"},
        {"type": "string", "pattern": r"\S+@\S+"},
        {"type": "string", "pattern": r"^\W\D[^\s\d]$"},
        {"type": "string", "pattern": r'^(a|"|b)\.$'},
    ],
    "anyOf": [
        _obj(
            {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 3}},
            anyOf=[{"required": ["a"]}, {"required": ["b"]}],
        ),
        {"anyOf": [{"type": "integer", "minimum": 5}, {"type": "string", "maxLength": 2}]},
    ],
    "oneOf": [
        {
            "oneOf": [
                _obj({"kind": {"const": "a"}, "x": {"type": "integer"}}, ["kind", "x"]),
                _obj({"kind": {"const": "b"}, "y": {"type": "boolean"}}, ["kind", "y"]),
            ]
        },
        {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
    ],
    "allOf": [
        {
            "allOf": [
                _obj({"a": {"type": "integer", "minimum": 0}}, ["a"]),
                {"properties": {"a": {"maximum": 5}, "b": {"type": "boolean"}}, "required": ["b"]},
            ]
        },
        {"allOf": [{"type": "integer"}, {"minimum": 3}, {"maximum": 4}]},
    ],
    "$ref": [
        {"$defs": {"node": NODE}, "$ref": "#/$defs/node"},
        {
            "$defs": {"s": {"type": "string"}},
            **_obj({"x": {"$ref": "#/$defs/s", "maxLength": 3}}, ["x"]),
        },
    ],
    "$defs": [
        {
            "$defs": {"n": {"type": "integer", "maximum": 3}},
            "type": "array",
            "items": {"$ref": "#/$defs/n"},
        }
    ],
    "definitions": [
        {
            "definitions": {"n": {"enum": ["p", "q"]}},
            "type": "array",
            "items": {"$ref": "#/definitions/n"},
        }
    ],
}


def test_the_cases_cover_the_table_exactly():
    assert set(CASES) == set(ENFORCED)


def test_the_readme_holds_the_table():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert readme_table() in readme


@pytest.fixture(scope="module")
def core(qwen3):
    c = EngineCore(
        EngineConfig(
            model="random",
            max_num_seqs=256,
            structured_output=StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
            seed=5,
        ),
        qwen3,
    )
    yield c
    c.close()


def _generate(core, seeds: int) -> dict[str, list[str]]:
    """keyword -> why each invalid output was invalid (empty: all valid)."""
    prompt = core.tokenizer.encode("Answer with JSON.")
    jobs, requests = [], []
    for keyword, schemas in CASES.items():
        for i, schema in enumerate(schemas):
            spec = StructuredOutputSpec("json_schema", json.dumps(schema))
            for s in range(seeds):
                jobs.append((keyword, schema))
                requests.append(
                    EngineCoreRequest(
                        f"{keyword}-{i}-{s}",
                        prompt,
                        SamplingParams(max_tokens=MAX_TOKENS, seed=s),
                        spec,
                    )
                )
    problems: dict[str, list[str]] = {k: [] for k in CASES}
    finished = 0
    for (keyword, schema), res in zip(jobs, run_to_end(core, requests), strict=True):
        if res.reason != FinishReason.STOP:
            if res.reason != FinishReason.LENGTH:
                problems[keyword].append(f"ended with {res.reason}: {res.error}")
            continue
        finished += 1
        text = res.text(core.tokenizer)
        try:
            value = json.loads(text, strict=False)
            jsonschema.validators.validator_for(schema)(schema).validate(value)
        except (ValueError, jsonschema.ValidationError) as e:
            problems[keyword].append(f"{json.dumps(schema)}: {text!r}: {str(e).splitlines()[0]}")
    print(f"{finished}/{len(requests)} finished")
    assert finished >= 0.9 * len(requests), f"only {finished}/{len(requests)} finished"
    return problems


@pytest.fixture(scope="module")
def generated(core):
    return _generate(core, SEEDS)


@pytest.mark.parametrize("keyword", list(CASES))
def test_enforced_keywords_give_valid_outputs(generated, keyword):
    assert not generated[keyword], "\n".join(generated[keyword][:5])


@pytest.mark.slow
def test_enforced_keywords_give_valid_outputs_many_seeds(core):
    problems = _generate(core, SLOW_SEEDS)
    assert not any(problems.values()), {k: v[:3] for k, v in problems.items() if v}


def test_refused_keywords_are_refused_by_the_engine(core):
    prompt = core.tokenizer.encode("Answer with JSON.")
    requests = []
    for keyword in REFUSED:
        schema = _obj({"p": {"type": "string", keyword: REFUSED_VALUES[keyword]}})
        spec = StructuredOutputSpec("json_schema", json.dumps(schema))
        requests.append(EngineCoreRequest(keyword, prompt, SamplingParams(max_tokens=8), spec))
    for keyword, res in zip(REFUSED, run_to_end(core, requests), strict=True):
        assert res.reason == FinishReason.ERROR, keyword
        assert res.error.startswith(f"response_format schema: {keyword} at 'p' cannot be enforced")
