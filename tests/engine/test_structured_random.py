"""Structured outputs under an adversarial model: the random-logits model, 200 seeds
per kind of grammar. Every output that finished with "stop" must be valid; at least
90% must finish with "stop" within max_tokens (the model favours tokens that close
strings and structures, so it ends, but is otherwise random)."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest

from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from tests.support.engine import EngineHarness, collect

SEEDS = 200
MAX_TOKENS = 384
PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "details": {
            "type": "object",
            "properties": {"wind": {"type": "boolean"}, "hours": {"type": "array", "items": {"type": "integer"}}},
            "required": ["wind"],
        },
        "score": {"type": "number"},
    },
    "required": ["city", "unit"],
}


def _tool(name: str, props: dict, required: list[str]) -> dict:
    return {"name": name, "parameters": {"type": "object", "properties": props, "required": required}}


TOOLS = [
    _tool("get_weather", WEATHER["properties"], ["city", "unit"]),
    _tool("get_time", {"tz": {"type": "string"}}, ["tz"]),
    _tool("search", {"query": {"type": "string"}, "limit": {"type": "integer"}}, ["query"]),
    _tool("send_email", {"to": {"type": "array", "items": {"type": "string"}}, "subject": {"type": "string"},
                         "urgent": {"type": "boolean"}}, ["to", "subject"]),
    _tool("convert", {"amount": {"type": "number"}, "from": {"enum": ["USD", "EUR", "JPY"]},
                      "to": {"enum": ["USD", "EUR", "JPY"]}}, ["amount", "from", "to"]),
    _tool("book", {"room": {"type": "string"}, "slot": {"type": "object", "properties": {
        "start": {"type": "string"}, "minutes": {"type": "integer"}}, "required": ["start"]}}, ["room", "slot"]),
    _tool("noop", {}, []),
    _tool("rate", {"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "note": {"type": ["string", "null"]}},
          ["stars"]),
]

REQUIRED_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"enum": [t["name"]]}, "parameters": t["parameters"]},
                "required": ["name", "parameters"],
            }
            for t in TOOLS
        ]
    },
}


def _hermes_tag(tools: list[dict]) -> dict:
    return {
        "type": "structural_tag",
        "format": {
            "type": "tags_with_separator",
            "separator": "\n",
            "at_least_one": True,
            "tags": [
                {
                    "type": "tag",
                    "begin": {"type": "token", "token": "<tool_call>"},
                    "content": {
                        "type": "sequence",
                        "elements": [
                            {"type": "const_string", "value": f'\n{{"name": "{t["name"]}", "arguments": '},
                            {"type": "json_schema", "json_schema": t["parameters"], "max_whitespace_cnt": 4},
                            {"type": "const_string", "value": "}\n"},
                        ],
                    },
                    "end": {"type": "token", "token": "</tool_call>"},
                }
                for t in tools
            ],
        },
    }


EBNF = r"""
root ::= expr
expr ::= term (" + " term)*
term ::= num | "(" expr ")"
num ::= [1-9] [0-9]*
"""


def _parse_expr(s: str) -> bool:
    """A recursive-descent check of the EBNF above (independent of xgrammar)."""
    pos = 0

    def term() -> bool:
        nonlocal pos
        if pos < len(s) and s[pos] == "(":
            pos += 1
            if not expr() or pos >= len(s) or s[pos] != ")":
                return False
            pos += 1
            return True
        m = re.match(r"[1-9][0-9]*", s[pos:])
        if not m:
            return False
        pos += m.end()
        return True

    def expr() -> bool:
        nonlocal pos
        if not term():
            return False
        while s.startswith(" + ", pos):
            pos += 3
            if not term():
                return False
        return True

    return expr() and pos == len(s)


def _check_hermes(text: str) -> bool:
    calls = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, flags=re.S)
    rest = re.sub(r"<tool_call>\n.*?\n</tool_call>", "", text, flags=re.S)
    if not calls or rest.strip():
        return False
    by_name = {t["name"]: t["parameters"] for t in TOOLS}
    for c in calls:
        obj = json.loads(c)
        jsonschema.validate(obj["arguments"], by_name[obj["name"]])
    return True


REGEX = r"[A-Z]{2}-\d{3,5}(\.[a-z]{1,4})?"
CHOICES = ["alpha", "beta", "gamma delta", "ε-ζ"]

CASES = {
    "one_tool_schema": (StructuredOutputSpec("json_schema", json.dumps(WEATHER)),
                        lambda t: jsonschema.validate(json.loads(t), WEATHER) is None),
    "required_8_tools_schema": (StructuredOutputSpec("json_schema", json.dumps(REQUIRED_SCHEMA)),
                                lambda t: jsonschema.validate(json.loads(t), REQUIRED_SCHEMA) is None),
    "hermes_structural_tag": (StructuredOutputSpec("structural_tag", json.dumps(_hermes_tag(TOOLS))),
                              _check_hermes),
    "regex": (StructuredOutputSpec("regex", REGEX), lambda t: re.fullmatch(REGEX, t) is not None),
    "choice": (StructuredOutputSpec("choice", json.dumps(CHOICES)), lambda t: t in CHOICES),
    "ebnf": (StructuredOutputSpec("grammar", EBNF), _parse_expr),
}


@pytest.fixture(scope="module")
def engine():
    h = EngineHarness(EngineConfig(model="random", max_num_seqs=256, seed=3))
    yield h
    h.close()


@pytest.mark.parametrize("case", list(CASES))
def test_random_model_outputs_are_valid(engine, case):
    spec, valid = CASES[case]
    tok = engine.client.tokenizer()

    async def body():
        reqs = [
            EngineCoreRequest(f"{case}-{s}", PROMPT, SamplingParams(max_tokens=MAX_TOKENS, seed=s), spec)
            for s in range(SEEDS)
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
        text = tok.decode(ids[:-1])
        try:
            ok = valid(text)
        except (ValueError, jsonschema.ValidationError):
            ok = False
        if not ok:
            invalid += 1
            print(f"seed {seed}: invalid output {text!r}")
    print(f"{case}: {stopped}/{SEEDS} finished with stop, {invalid} invalid")
    assert invalid == 0
    assert stopped >= 0.9 * SEEDS
