"""Specs compile as the engine compiles them; special tokens are sealed: never text
inside what a grammar generates, always one token where a grammar names them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xgrammar as xgr

from structured_output import GrammarError, GrammarSpec, LocalCompiler


@pytest.fixture(scope="module")
def compiler(qwen3):
    return LocalCompiler(qwen3)


def _allowed(matcher, vocab_rows):
    bm = xgr.allocate_token_bitmask(1, vocab_rows)
    matcher.fill_next_token_bitmask(bm)
    bits = np.unpackbits(bm.numpy().view(np.uint8), bitorder="little")[:vocab_rows]
    return set(np.flatnonzero(bits).tolist())


def _feed(matcher, ids):
    for t in ids:
        assert matcher.accept_token(t), t


def test_no_special_token_inside_a_json_string(qwen3, compiler):
    m = compiler.matcher(GrammarSpec.of("json_object"))
    _feed(m, qwen3.encode('{"k": "v'))
    allowed = _allowed(m, qwen3.vocab_rows)
    assert not allowed & set(qwen3.special_ids)
    assert qwen3.encode("x")[0] in allowed


def test_markers_written_as_text_in_a_structural_tag_become_tokens(qwen3, compiler):
    # xgrammar's own templates write markers inside literals like this
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<tool_call>"],
            "at_least_one": True,
            "stop_after_first": True,
            "tags": [
                {
                    "type": "tag",
                    "begin": '<tool_call>\n{"name": "f", "arguments": ',
                    "content": {
                        "type": "json_schema",
                        "json_schema": {"type": "object", "properties": {}},
                    },
                    "end": "}\n</tool_call>",
                }
            ],
        },
    }
    m = compiler.matcher(GrammarSpec.of("structural_tag", json.dumps(tag)))
    assert qwen3.id_of("<tool_call>") in _allowed(m, qwen3.vocab_rows)
    _feed(m, qwen3.encode('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'))
    assert m.is_completed()
    # spelled with ordinary tokens, the marker is not accepted
    m2 = compiler.matcher(GrammarSpec.of("structural_tag", json.dumps(tag)))
    assert not m2.accept_token(qwen3.encode("<", special=False)[0])


def test_tokens_named_by_text_resolve(qwen3, compiler):
    tag = {
        "type": "tag",
        "begin": {"type": "token", "token": "<think>"},
        "content": {"type": "const_string", "value": "ok"},
        "end": {"type": "token", "token": "</think>"},
    }
    m = compiler.matcher(GrammarSpec.of("structural_tag", json.dumps(tag)))
    _feed(m, [qwen3.id_of("<think>")] + qwen3.encode("ok") + [qwen3.id_of("</think>")])
    assert m.is_completed()


@pytest.mark.parametrize(
    ("kind", "value", "needle"),
    [
        ("json_schema", '{"type": "objec"}', "objec"),
        ("json_schema", "[1, 2]", "JSON object"),
        ("regex", "(a", "parenthesis"),
        ("grammar", 'root ::= "a" |', "EBNF"),
        ("choice", "[]", "non-empty"),
        ("structural_tag", '{"type": "nope"}', "structural"),
        (
            "structural_tag",
            '{"type": "structural_tag", "format": {"type": "tag", "begin": 3}}',
            "structural_tag",
        ),
    ],
)
def test_bad_specs_say_what_is_wrong(compiler, kind, value, needle):
    with pytest.raises(GrammarError, match=needle):
        compiler.compile(GrammarSpec.of(kind, value))
