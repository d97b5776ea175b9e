"""The test support the engine's round trips reuse: random tool sets and the
constrained sampler."""

from __future__ import annotations

import json
import random
import time

import jsonschema

from tests.support.constrained_sampler import free_text_ends
from tests.support.toolsets import random_tool_set, tool_sets

from .conftest import EXAMPLE_TOOLS, format_for, sampler_for


def _walk(node: object):  # noqa: ANN202
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


KEYWORDS = ("enum", "pattern", "format", "maxLength", "$ref", "required", "minItems", "maxItems")


def test_tool_sets_are_seeded_valid_and_varied() -> None:
    first = [[(t.name, json.dumps(t.parameters)) for t in s] for s in tool_sets(5, 20)]
    again = [[(t.name, json.dumps(t.parameters)) for t in s] for s in tool_sets(5, 20)]
    assert first == again
    seen: set[str] = set()
    for tools in tool_sets(11, 200):
        assert 1 <= len(tools) <= 8
        assert len({t.name for t in tools}) == len(tools)
        for t in tools:
            jsonschema.validators.validator_for(t.schema).check_schema(t.schema)
            assert t.description
            for node in _walk(t.parameters):
                seen.update(k for k in KEYWORDS if k in node)
                if isinstance(node.get("type"), str):
                    seen.add(node["type"])
    assert seen >= {
        "string", "integer", "number", "boolean", "array", "object", "enum", "pattern",
        "format", "maxLength", "$ref", "required", "minItems", "maxItems",
    }  # fmt: skip


def test_random_tool_set_takes_a_generator() -> None:
    a = random_tool_set(random.Random(3), max_tools=2)
    b = random_tool_set(random.Random(3), max_tools=2)
    assert [t.name for t in a] == [t.name for t in b] and len(a) <= 2


def test_sampler_is_seeded_cheap_and_ends() -> None:
    fmt = format_for("hermes")
    sampler = sampler_for(fmt.tokenizer)
    spec = fmt.constraint(EXAMPLE_TOOLS, named=None, parallel=True)
    compiled = sampler.compile(spec)
    ends = free_text_ends(spec)
    runs = [sampler.generate(compiled, random.Random(k), free_text_ends=ends) for k in range(20)]
    again = sampler.generate(compiled, random.Random(0), free_text_ends=ends)
    assert again.token_ids == runs[0].token_ids
    assert all(r.finished for r in runs)

    # this thread's CPU time, not the wall clock: other processes do not count
    start = time.thread_time()
    steps = sum(len(r.token_ids) + 1 for r in runs)
    for k in range(20):
        sampler.generate(compiled, random.Random(k), free_text_ends=ends)
    assert (time.thread_time() - start) / steps < 1e-3
