"""Raw control characters in JSON strings: the guard masks them only for grammars whose
strings let them through (`structured_output.guard.refuses_control`), on the real
qwen3 vocabulary and real xgrammar matchers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench.states import REQUIRED_SCHEMA, TOOLS
from structured_output import CompileOptions, GrammarSpec, LocalCompiler
from structured_output.whitespace import refuses_control
from tests.support.grammars import hermes_tag


@pytest.fixture(scope="module")
def lc(qwen3):
    return LocalCompiler(qwen3, CompileOptions(max_whitespace=16))


def _schema(schema: dict) -> GrammarSpec:
    return GrammarSpec.of("json_schema", json.dumps(schema))


OBJECT = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}

#: (spec, whether its grammar refuses raw control characters in strings by itself)
CASES = {
    "plain_strings": (_schema(OBJECT), True),
    "array_of_strings": (_schema({"type": "array", "items": {"type": "string"}}), True),
    "enum_with_a_tab": (_schema({"enum": ["a\tb", "[^x]"]}), True),
    "format_email": (_schema({"type": "string", "format": "email"}), True),
    "required_tools": (_schema(REQUIRED_SCHEMA), True),
    "json_object": (GrammarSpec.of("json_object", ""), True),
    "hermes_tag": (GrammarSpec.of("structural_tag", json.dumps(hermes_tag(TOOLS))), True),
    "max_length": (_schema({"type": "string", "maxLength": 8}), False),
    "min_length": (_schema({"type": "string", "minLength": 2}), False),
    # the engine writes a pattern's ``.`` as a class without control characters
    "pattern": (_schema({"type": "string", "pattern": "^a.*$"}), True),
    "pattern_properties": (
        _schema({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}),
        False,
    ),
    "regex": (GrammarSpec.of("regex", "[a-z]+"), False),  # raw text: not lexed as JSON
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_which_grammars_refuse_control_characters_by_themselves(lc, name):
    spec, refuses = CASES[name]
    grammar = lc.compile(spec)
    assert grammar.refuses_control is refuses
    assert lc.matcher(grammar).guard_lenient is refuses


def test_the_judgement_reads_classes_not_quoted_literals():
    """A literal ``"["`` before a class that lets control characters through must not
    hide that class; a class that names a control character is caught however spelled."""
    assert refuses_control(r'a ::= "[" [^\0-\x1f\"\\] "]"')
    assert not refuses_control(r'a ::= "[" [^\"\\\r\n] "]"')
    assert not refuses_control(r"a ::= [^\x01-\x1f\"]")  # U+0000 let through
    assert not refuses_control(r"a ::= [\x00-\x7f]")
    assert not refuses_control(r"a ::= [\t-\r]")  # a range over U+000B and U+000C
    assert not refuses_control(r"a ::= [a\u0007]")
    assert refuses_control(r"ws ::= [ \n\r\t]* [ -~]")


def _fill(m, bm: torch.Tensor, lenient: bool) -> np.ndarray:
    m.guard_lenient = lenient
    m.fill_next_token_bitmask(bm)
    return bm[0].numpy().view(np.uint32).copy()


@pytest.mark.parametrize("name", ["plain_strings", "required_tools", "json_object", "hermes_tag"])
def test_lenient_masks_equal_strict_ones_where_the_grammar_refuses(qwen3, lc, name):
    """Along random walks, a grammar judged to refuse raw control characters gets the
    same masks from the lenient table as from the strict one: the bans it skips are
    ones the grammar makes itself."""
    grammar = lc.compile(CASES[name][0])
    assert grammar.refuses_control
    bm = torch.zeros((1, (qwen3.vocab_rows + 31) // 32), dtype=torch.int32)
    rng = np.random.default_rng(3)
    steps = 0
    for _ in range(4):
        m = lc.matcher(grammar)
        for _ in range(40):
            if m.is_terminated():
                break
            strict = _fill(m, bm, False)
            lenient = _fill(m, bm, True)
            np.testing.assert_array_equal(lenient, strict)
            bits = np.unpackbits(lenient.view(np.uint8), bitorder="little")[: qwen3.vocab_rows]
            ids = np.flatnonzero(bits)
            assert m.accept_token(int(ids[rng.integers(len(ids))]))
            steps += 1
    assert steps >= 40


def test_a_bounded_string_would_let_a_tab_through_without_the_strict_table(qwen3, lc):
    """What the comparison above would catch: with the lenient table, a length-bounded
    string (whose grammar allows raw control characters) would take a tab."""
    grammar = lc.compile(CASES["max_length"][0])
    tab = qwen3.all_token_bytes.index(b"\t")
    m = lc.matcher(grammar)
    assert m.accept_string('"')
    bm = torch.zeros((1, (qwen3.vocab_rows + 31) // 32), dtype=torch.int32)
    strict, lenient = _fill(m, bm, False), _fill(m, bm, True)
    assert not strict[tab >> 5] >> (tab & 31) & 1
    assert lenient[tab >> 5] >> (tab & 31) & 1
