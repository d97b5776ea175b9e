"""Masks mid-escape in a free JSON string, derived from the string's start mask
(`structured_output.escape_masks`) instead of filled: at every point of every kind of
escape, in strings read by each kind of rule (a schema's value, a key, an array's item,
xgrammar's builtin grammar for any JSON with its two rules side by side, a tool call's
argument inside a structural tag), on two real vocabularies, each mask equals a fresh
fill, and xgrammar fills none of them."""

from __future__ import annotations

import functools
import json
import random
import zlib

import numpy as np
import pytest
import torch

from bench import states
from structured_output import CompileOptions, GrammarSpec, LocalCompiler
from structured_output.bitmask import BitmaskFiller
from structured_output.escape_masks import AFTER_BACKSLASH, escape_kind
from structured_output.guard import GuardedGrammar
from structured_output.guide import RequestGuide
from tests.support.toolsets import tool_sets
from tests.tool_formats.conftest import FAMILIES, format_for, tokenizer_for

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "string"},
        "b": {"type": "array", "items": {"type": "string"}},
        "c": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
#: (grammar, text up to a string's text): value, array item, key, last value, nested
PREFIXES = [
    ("schema", '{"a": "xy'),
    ("schema", '{"a": "x", "b": ["p'),
    ("schema", '{"c": {"ke'),
    ("builtin", '{"k": "ab'),  # read by two rules: one before a comma, one before a brace
    ("builtin", '["x'),
    ("builtin", '{"k'),
    ("json_object", '{"k": [1, "v'),
    ("hermes_tag", '\n{"name": "get_time", "arguments": {"tz": "Rey'),
]
#: escapes of every kind: each letter, a ``\\u`` escape, a surrogate pair, two in a row
ESCAPES = ["\\n", '\\"', "\\\\", "\\/", "\\u00e9", "\\u4E2d", "\\ud83d\\ude00", "\\t\\u0041"]


@functools.cache
def _compiler(tok):
    """One compiler and guard table per vocabulary in this module."""
    return LocalCompiler(tok, CompileOptions(max_whitespace=16))


@pytest.fixture(scope="module", params=["qwen3", "harmony"])
def setup(request):
    tok = request.getfixturevalue(request.param)
    lc = _compiler(tok)
    grammars = {
        "schema": lc.compile(GrammarSpec.of("json_schema", json.dumps(SCHEMA))),
        "builtin": GuardedGrammar.wrap(lc.compiler.compile_builtin_json_grammar(), True),
        "json_object": lc.compile(GrammarSpec.of("json_object", "")),
    }
    if request.param == "qwen3":  # the bench's hermes tag names qwen3's markers
        grammars["hermes_tag"] = lc.compile(states.SPECS["hermes_tag"])
    return tok, lc, grammars


def _ids(tok, text: str) -> list[int]:
    """One token per character (every vocabulary here has each ASCII byte as one)."""
    out = []
    for c in text:
        one = tok.encode(c, special=False)
        assert len(one) == 1, c
        out += one
    return out


def _mid_escape(text: str) -> list[bool]:
    """Per position of ``text``: whether the text before it stops mid-escape."""
    out, due = [], 0
    for c in text:
        out.append(due > 0)
        if due == -1:  # after a backslash
            due = 4 if c == "u" else 0
        elif due > 0:
            due -= 1
        elif c == "\\":
            due = -1
    return out


@pytest.mark.parametrize("escape", ESCAPES)
def test_masks_mid_escape_equal_fresh_fills_and_none_is_filled(setup, escape):
    tok, lc, grammars = setup
    for name, prefix in PREFIXES:
        if name not in grammars:
            continue
        g = grammars[name]
        head = [tok.id_of("<tool_call>")] if name == "hermes_tag" else []
        text = prefix + escape + "z" + escape
        ids = head + _ids(tok, text)
        mid = [False] * len(head) + _mid_escape(text)
        m, twin = lc.matcher(g), lc.matcher(g)
        filler = BitmaskFiller(1, tok.vocab_rows, guard=lc.guard)
        fills = []
        fill = filler._fill_one
        filler._fill_one = lambda *a, fill=fill, fills=fills: fills.append(1) or fill(*a)
        want = torch.zeros((1, filler.words), dtype=torch.int32)
        derived = 0
        for t, inside in zip(ids, mid, strict=True):
            before = len(fills)
            got = filler.fill([0], [RequestGuide(None, m)])
            twin.fill_next_token_bitmask(want, 0)
            where = f"{name} {prefix!r} then {escape!r}, at {tok.decode([t])!r}"
            assert torch.equal(got.buffer[0], want[0]), where
            if inside:
                assert len(fills) == before, f"filled mid-escape: {where}"
                derived += 1
            assert m.accept_token(t) and twin.accept_token(t), where
        assert derived == sum(mid)


def test_a_stop_token_that_is_a_witness_is_asked_instead(qwen3):
    """A request's stop token may be an ordinary token (its bit in the string's start
    mask is the stop's, not its text's): where it stands witness for tokens that end a
    string after an escape, the mask is still the fresh one."""
    lc = _compiler(qwen3)
    g = lc.compile(GrammarSpec.of("json_schema", json.dumps(SCHEMA)))
    m = lc.matcher(g)
    filler = BitmaskFiller(1, qwen3.vocab_rows, guard=lc.guard)
    for t in _ids(qwen3, '{"a": "xy\\'):
        filler.fill([0], [RequestGuide(None, m)])
        assert m.accept_token(t)
    rules = [m._kept.rules[r] for r in m.memo["start"][1]]
    tables = m._kept.plain.escape_tables(rules)
    _, asked, witness, _ = tables.kinds[AFTER_BACKSLASH]
    assert len(asked), "no token ends a string after a backslash: nothing to test"
    used = set(_ids(qwen3, '{"a": "xy\\'))
    stops = sorted({int(w) for w in witness if int(w) not in used})[:5]
    stops += list(qwen3.stop_token_ids)
    for grammar_stops in (None, stops):
        m, twin = (
            lc.matcher(g, stop_token_ids=grammar_stops),
            lc.matcher(g, stop_token_ids=grammar_stops),
        )
        want = torch.zeros((1, filler.words), dtype=torch.int32)
        for t in _ids(qwen3, '{"a": "xy\\'):
            got = filler.fill([0], [RequestGuide(None, m)])
            twin.fill_next_token_bitmask(want, 0)
            assert m.accept_token(t) and twin.accept_token(t)
        got = filler.fill([0], [RequestGuide(None, m)])
        twin.fill_next_token_bitmask(want, 0)
        assert torch.equal(got.buffer[0], want[0]), grammar_stops


def test_escape_kinds_are_told_by_stepping_forks(qwen3):
    """The kind of each point of a ``\\u`` escape, and None outside one."""
    lc = _compiler(qwen3)
    g = lc.compile(GrammarSpec.of("json_schema", json.dumps(SCHEMA)))
    m = lc.matcher(g)
    assert m.accept_string('{"a": "x')
    kinds = []
    for c in "\\u00e":
        assert m.accept_string(c)
        kinds.append(escape_kind(m.fork))
    assert kinds == [AFTER_BACKSLASH, 4, 3, 2, 1]


def test_a_grammars_tables_are_built_before_its_first_string(qwen3, monkeypatch):
    """`KeptStrings.warm` (the engine calls it on the compile thread) builds the plain
    and escape tables of a grammar's string classes: a structural tag whose strings
    must not contain its end tag has a class of its own, and its first escape then
    builds nothing on the step."""
    import structured_output.escape_masks as escape_masks
    from structured_output.string_masks import kept_for

    lc = LocalCompiler(qwen3, CompileOptions(max_whitespace=16))  # fresh tables
    built = []
    real = escape_masks.EscapeTables.__init__
    monkeypatch.setattr(
        escape_masks.EscapeTables,
        "__init__",
        lambda self, *a, **k: built.append(1) or real(self, *a, **k),
    )
    g = lc.compile(states.SPECS["hermes_tag"])
    kept_for(g, lc.guard.plain).warm()
    assert built, "the tag's string class has tables of its own"
    before = len(built)
    m, twin = lc.matcher(g), lc.matcher(g)
    filler = BitmaskFiller(1, qwen3.vocab_rows, guard=lc.guard)
    want = torch.zeros((1, filler.words), dtype=torch.int32)
    text = '\n{"name": "get_time", "arguments": {"tz": "a\\u00e9'
    for t in [qwen3.id_of("<tool_call>"), *_ids(qwen3, text)]:
        got = filler.fill([0], [RequestGuide(None, m)])
        twin.fill_next_token_bitmask(want, 0)
        assert torch.equal(got.buffer[0], want[0])
        assert m.accept_token(t) and twin.accept_token(t)
    assert len(built) == before


def test_the_compile_service_prepares_each_new_grammar_and_survives_a_failure(qwen3, caplog):
    from structured_output.compile_service import CompileService
    from structured_output.vocab import tokenizer_info_for

    seen = []

    def prepare(grammar):
        seen.append(grammar)
        if len(seen) == 2:
            raise RuntimeError("injected: no tables")

    svc = CompileService(
        qwen3, CompileOptions(), tokenizer_info_for(qwen3), num_workers=0, prepare=prepare
    )
    try:
        specs = [GrammarSpec.of("json_schema", json.dumps(SCHEMA)), GrammarSpec.of("regex", "a+")]
        got = [svc.submit(s).result(60) for s in specs]
        assert seen == got  # each prepared before its request had it
        assert svc.submit(specs[0]).result(60) is not None and len(seen) == 2  # cached
    finally:
        svc.close()
    assert "preparing a compiled regex failed" in caplog.text


@pytest.mark.parametrize("family", FAMILIES)
def test_every_tool_formats_arguments_derive_their_masks_mid_escape(family):
    """Every family of the tool-format registry, its forced-call constraint over
    generated tool sets: rows walk random allowed tokens (leaning to quotes and
    letters, into the arguments' strings), and inside each free string they reach they
    write escapes of every kind; each mask equals a fresh fill, and none mid-escape is
    filled by xgrammar. Families whose arguments are not JSON text keep no memo:
    nothing is derived there, and their masks are still exact."""
    tok, fmt = tokenizer_for(family), format_for(family)
    seed = zlib.crc32(family.encode())
    rng = random.Random(seed)
    lc = _compiler(tok)
    filler = BitmaskFiller(1, tok.vocab_rows, guard=lc.guard)
    fills = []
    fill = filler._fill_one
    filler._fill_one = lambda *a: fills.append(1) or fill(*a)
    want = torch.zeros((1, filler.words), dtype=torch.int32)
    lean = _ids(tok, '"az')  # quotes to open strings, letters to write them
    text = "\\u00e9\\n\\ud83d\\ude00\\\\"
    escape, mid = _ids(tok, text), _mid_escape(text)
    derived = strings = 0
    json_text = False

    def step(m, twin, t=None):
        got = filler.fill([0], [RequestGuide(None, m)])
        twin.fill_next_token_bitmask(want, 0)
        assert torch.equal(got.buffer[0], want[0]), family
        if t is None:
            bits = np.unpackbits(want[0].numpy().view(np.uint8), bitorder="little")
            allowed = np.flatnonzero(bits[: tok.vocab_rows])
            leaning = [x for x in lean if bits[x]]
            t = rng.choice(leaning) if leaning and rng.random() < 0.7 else int(rng.choice(allowed))
        assert m.accept_token(t) and twin.accept_token(t), family

    for tools in tool_sets(seed, 8):  # until escapes are written in two strings, or eight calls
        spec = fmt.constraint(tools, named=None, parallel=False)
        g = lc.compile(GrammarSpec.of(spec.kind.value, spec.value))
        m, twin = lc.matcher(g), lc.matcher(g)
        json_text = m.guard_lexes_strings and bool(m._kept.escapes)
        for _ in range(300):
            if m.is_terminated():
                break
            if json_text and m.keep and m.memo is not None:  # inside a free JSON string
                strings += 1
                for t, inside in zip(escape, mid, strict=True):
                    before = len(fills)
                    step(m, twin, t)
                    if inside:
                        assert len(fills) == before, f"{family}: filled mid-escape"
                        derived += 1
            step(m, twin)
        if strings >= 2 or not json_text:
            break
    if json_text:
        assert strings and derived == strings * sum(mid), (family, strings, derived)
    else:
        assert derived == 0
