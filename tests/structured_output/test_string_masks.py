"""Masks kept inside free JSON strings (`structured_output.string_masks`): every kept
mask equals a fresh fill of the same state, over random walks through real grammars
(free and limited strings, escapes, keys, structural tags whose strings exclude an end
tag), row by row and threaded; and the rules and tables they rest on are read right."""

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
from structured_output.guard import GuardedGrammar
from structured_output.guide import RequestGuide
from structured_output.string_masks import PlainTables, self_loop_rules
from tests.support.toolsets import tool_sets
from tests.tool_formats.conftest import FAMILIES, format_for, tokenizer_for

SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    {  # strings that are not free, beside free ones
        "type": "object",
        "properties": {
            "short": {"type": "string", "maxLength": 4},
            "long": {"type": "string", "minLength": 3},
            "code": {"type": "string", "pattern": "^[a-z]+[0-9]*$"},
            "kind": {"enum": ["alpha", "beta gamma"]},
            "when": {"type": "string", "format": "date"},
            "text": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "either": {"anyOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]},
        },
        "required": ["short", "code", "kind", "text", "tags", "either"],
    },
    {"type": "object", "additionalProperties": {"type": "string"}},  # free keys too
    {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
]

#: tokens the walks lean to, where the grammar allows them: into, through and out of
#: strings (quotes, escapes, a partial character, an end tag's first characters)
STEER = [
    *('"', ' "', '":', '",', " the", "a", "q", "é", "\\", '\\"', "\\n", "\\u00", "_", "<", "}"),
    *("\\u", "4e", "2d", "00", "e9", "n", "u"),  # ``\\u`` escapes, and a backslash's next
    *('":"', '","', '": "', '", "'),  # one string ends and the next begins, in one token
]


@functools.cache
def _compilers(tok):
    """One compiler and guard table per vocabulary in this module (a guard table takes
    about half a second to build)."""
    return LocalCompiler(tok, CompileOptions(max_whitespace=16))


@pytest.fixture(scope="module")
def lc(qwen3):
    """One compiler and guard table for the module (each costs about half a second)."""
    return _compilers(qwen3)


def _grammars(lc):
    out = [lc.compile(GrammarSpec.of("json_schema", json.dumps(s))) for s in SCHEMAS]
    out.append(lc.compile(states.SPECS["hermes_tag"]))
    out.append(_builtin_json(lc))
    return out


def _builtin_json(lc):
    """xgrammar's own grammar for any JSON (what other engines serve ``json_object``
    with): an object's string value is read by two rules side by side."""
    return GuardedGrammar.wrap(lc.compiler.compile_builtin_json_grammar(), True)


def _allowed(words: np.ndarray, vocab: int) -> np.ndarray:
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


def _walk(lc, grammars, tok, rows: int, steps: int, seed: int) -> tuple[int, int]:
    """``rows`` matchers walk ``steps`` tokens at once through one filler (the loop
    below 32 rows, the threads from there), each beside a twin that fills afresh; every
    mask must equal the twin's. Returns (steps kept, steps in all)."""
    rng = random.Random(seed)
    steer = {}
    for text in STEER:
        ids = tok.encode(text, special=False)
        if len(ids) == 1:
            steer[text] = ids[0]
    pairs = [
        (lc.matcher(grammars[i % len(grammars)]), lc.matcher(grammars[i % len(grammars)]))
        for i in range(rows)
    ]
    filler = BitmaskFiller(rows, tok.vocab_rows, batch_threshold=32, max_threads=2)
    filler.guard = lc.guard
    twin_buf = torch.zeros((1, filler.words), dtype=torch.int32)
    kept = total = 0
    try:
        for _ in range(steps):
            live = [i for i, (m, _) in enumerate(pairs) if not m.is_terminated()]
            if not live:
                break
            was_kept = [pairs[i][0].keep for i in live]
            got = filler.fill(live, [RequestGuide(None, pairs[i][0]) for i in live])
            view = got.buffer.numpy().view(np.uint32)
            for i, k in zip(live, was_kept, strict=True):
                m, twin = pairs[i]
                twin.fill_next_token_bitmask(twin_buf, 0)
                expected = twin_buf[0].numpy().view(np.uint32)
                assert np.array_equal(view[i], expected), f"row {i}, kept {k}"
                kept += k
                total += 1
                leaning = [t for t in steer.values() if (expected[t >> 5] >> (t & 31)) & 1]
                if leaning and rng.random() < 0.4:
                    t = rng.choice(leaning)
                else:
                    t = int(rng.choice(_allowed(expected, tok.vocab_rows)))
                if rng.random() < 0.03 and m._history:  # now and then a step back
                    m.rollback(1)
                    twin.rollback(1)
                    continue
                assert m.accept_token(t) and twin.accept_token(t)
    finally:
        filler.close()
    print(f"kept {kept} of {total} steps")
    return kept, total


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kept_masks_equal_fresh_fills_row_by_row(qwen3, lc, seed):
    kept, total = _walk(lc, _grammars(lc), qwen3, rows=5, steps=300, seed=seed)
    assert kept > total // 20, (kept, total)  # the masks were kept, and often


def test_kept_masks_equal_fresh_fills_threaded(qwen3, lc):
    kept, total = _walk(lc, _grammars(lc), qwen3, rows=40, steps=80, seed=4)
    assert kept > total // 20, (kept, total)


def test_a_threaded_step_where_every_row_is_kept_or_remembered_fills_none(qwen3, lc):
    """Every row inside a free string (kept) or back at a string's text after an
    escape (remembered): the threaded path copies them all, asks xgrammar for none, and
    each row equals a fresh fill."""
    g = _builtin_json(lc)
    texts = ['{"a": "some text', '["xy zzy', '{"k": "a\\nb and more', '{"q": "say']
    pairs = []
    for text in texts * 3:
        m, twin = lc.matcher(g), lc.matcher(g)
        one = BitmaskFiller(1, qwen3.vocab_rows, guard=lc.guard)
        for t in qwen3.encode(text, special=False):
            one.fill([0], [RequestGuide(None, m)])
            assert m.accept_token(t) and twin.accept_token(t)
        pairs.append((m, twin))
    filler = BitmaskFiller(len(pairs), qwen3.vocab_rows, batch_threshold=2, max_threads=2)
    filler.guard = lc.guard
    fills = []
    batch_fill = filler._shared.fill
    filler._shared.fill = lambda *a, **k: fills.append(1) or batch_fill(*a, **k)
    want = torch.zeros((1, filler.words), dtype=torch.int32)
    try:
        for _ in range(2):  # the first step may still check a string; the second copies
            fills.clear()
            filler.buffers[0].zero_()  # nothing left over from the step before
            got = filler.fill(list(range(len(pairs))), [RequestGuide(None, m) for m, _ in pairs])
            for i, (_, twin) in enumerate(pairs):
                twin.fill_next_token_bitmask(want, 0)
                assert torch.equal(got.buffer[i], want[0]), i
        assert all(m.keep for m, _ in pairs) and not fills
    finally:
        filler.close()


def test_documents_walked_keep_masks_inside_their_strings(qwen3, lc):
    """The bench's documents, token by token: strings' text is mostly kept, and every
    kept mask is the fresh one."""
    v = states.vocab("qwen3")
    grammar = lc.compile(states.SPECS["hermes_tag"])
    rng = random.Random(5)
    buf = torch.zeros((2, (qwen3.vocab_rows + 31) // 32), dtype=torch.int32)
    filler = BitmaskFiller(1, qwen3.vocab_rows, batch_threshold=32)
    filler.guard = lc.guard
    kept = 0
    for _ in range(6):
        ids = v.encode(states.document(rng, "hermes_tag", v.markers))
        m, twin = lc.matcher(grammar), lc.matcher(grammar)
        for t in ids:
            k = m.keep
            got = filler.fill([0], [RequestGuide(None, m)])
            twin.fill_next_token_bitmask(buf, 1)
            assert torch.equal(got.buffer[0], buf[1])
            kept += k
            assert m.accept_token(t) and twin.accept_token(t)
    assert kept >= 20


@pytest.mark.parametrize("family", FAMILIES)
def test_every_tool_formats_forced_call_keeps_exact_masks(family):
    """Every family of the tool-format registry, its forced-call constraint over a
    generated tool set: rows walking random allowed tokens (steered through quotes,
    escapes and end markers' first characters, with steps back now and then) get, step
    after step, what a fresh fill gives, whether their mask was kept, remembered or
    filled."""
    tok, fmt = tokenizer_for(family), format_for(family)
    seed = zlib.crc32(family.encode())
    tools = next(tool_sets(seed, 1))
    spec = fmt.constraint(tools, named=None, parallel=True)
    lc = _compilers(tok)
    grammar = lc.compile(GrammarSpec.of(spec.kind.value, spec.value))
    _walk(lc, [grammar], tok, rows=4, steps=120, seed=seed)


CODE = (
    'def area(r):\n    import math\n    if r < 0:\n        raise ValueError("negative")\n'
    "    return math.pi * r ** 2\n\nprint(area(2.0))\n"
)
#: strings with many escapes: a program's lines, and text written as ``\\u`` escapes
ESCAPED = {
    "code": json.dumps({"path": "geometry/area.py", "content": CODE}),
    "cjk": json.dumps({"city": "東京都新宿区西新宿", "note": "会議は明日の午後三時から"}),  # \\u
    # escapes in keys and in values, each string ending and the next beginning in one
    # token (``":"``): the same points mid-escape, followed by different things
    "keys": json.dumps({"a\nb": "c\nd", "e\tf": "g\th"}, separators=(",", ":")),
}


@pytest.mark.parametrize("text", ESCAPED)
@pytest.mark.parametrize("grammar", ["builtin", "schema", "json_object"])
def test_masks_mid_escape_are_remembered_within_their_string(qwen3, lc, text, grammar):
    """Within one string, the masks mid-escape (after a backslash, in a ``\\u``
    escape's digits, where xgrammar's fills cost milliseconds) are filled once per
    point and copied after: each equal to a fresh fill, and fewer than 30% of the steps
    ask xgrammar (without the memo: 36% for the program, 98% for the escaped text)."""
    if grammar == "builtin":
        g = _builtin_json(lc)
    elif grammar == "json_object":  # keys and values read by one string rule
        g = lc.compile(GrammarSpec.of("json_object", ""))
    else:
        props = {k: {"type": "string"} for k in json.loads(ESCAPED[text])}
        g = lc.compile(GrammarSpec.of("json_schema", json.dumps({"properties": props})))
    ids = qwen3.encode(ESCAPED[text], special=False)
    m, twin = lc.matcher(g), lc.matcher(g)
    filler = BitmaskFiller(1, qwen3.vocab_rows, batch_threshold=32)
    filler.guard = lc.guard
    fills = []
    fill = filler._fill_one
    filler._fill_one = lambda *a: fills.append(1) or fill(*a)  # counts xgrammar's fills
    buf = torch.zeros((2, filler.words), dtype=torch.int32)
    for t in ids:
        got = filler.fill([0], [RequestGuide(None, m)])
        twin.fill_next_token_bitmask(buf, 1)
        assert torch.equal(got.buffer[0], buf[1])
        assert m.accept_token(t) and twin.accept_token(t)
    assert m.is_terminated() or m.accept_token(qwen3.stop_token_ids[0])
    if text != "keys":
        assert len(fills) < 0.3 * len(ids), (len(fills), len(ids))


def test_an_escaped_quote_keeps_its_strings_memo_and_a_closing_one_drops_it(qwen3, lc):
    """``\\"`` stays inside its string: the masks after it are copied from the string's
    memo (each equal to a fresh fill), while a token that closes the string (``",``,
    ``":``, which may open the next) forgets it at once."""
    props = {"q": {"type": "string"}, "r": {"type": "string"}}
    g = lc.compile(GrammarSpec.of("json_schema", json.dumps({"properties": props})))
    text = json.dumps({"q": 'say "hi" and "bye", then "more" twice', "r": "x"})
    ids = qwen3.encode(text, special=False)
    m, twin = lc.matcher(g), lc.matcher(g)
    filler = BitmaskFiller(1, qwen3.vocab_rows, batch_threshold=32)
    filler.guard = lc.guard
    fills = []
    fill = filler._fill_one
    filler._fill_one = lambda *a: fills.append(1) or fill(*a)
    buf = torch.zeros((2, filler.words), dtype=torch.int32)
    escaped = closing = 0
    for t in ids:
        got = filler.fill([0], [RequestGuide(None, m)])
        twin.fill_next_token_bitmask(buf, 1)
        assert torch.equal(got.buffer[0], buf[1])
        kept = m.memo is not None
        assert m.accept_token(t) and twin.accept_token(t)
        piece = qwen3.decode([t])
        if '\\"' in piece:  # inside the string: its memo stays
            assert m.memo is not None, piece
            escaped += 1
        elif kept and '"' in piece:  # the string ended (and another may begin)
            assert m.memo is None, piece
            closing += 1
    assert escaped >= 4 and closing >= 2
    # a fill to open each string, one after the opening quote of each value and
    # the key after it; none after the escaped quotes
    assert len(fills) <= 10, len(fills)


def test_self_loop_rules_are_read_from_the_grammars_text(qwen3, lc):
    free, limited, hermes = (
        lc.compile(GrammarSpec.of("json_schema", json.dumps(SCHEMAS[0]))),
        lc.compile(
            GrammarSpec.of(
                "json_schema",
                json.dumps({"type": "object", "properties": {"s": {"maxLength": 3}}}),
            )
        ),
        lc.compile(states.SPECS["hermes_tag"]),
    )
    for g in (free, limited, hermes):  # rule i is line i of the text
        names = [r[0] for r in json.loads(g.grammar.serialize_json())["rules"]]
        assert names == [line.split(" ::= ")[0] for line in str(g.grammar).split("\n") if line]
    (rule,) = self_loop_rules(str(free.grammar)).values()
    ranges, negated, firsts = rule
    assert negated and firsts == {ord('"'), ord("\\")}
    assert (0, 0x1F) in ranges and (ord("\n"), ord("\n")) in ranges
    assert not self_loop_rules(str(limited.grammar))
    loops = self_loop_rules(str(hermes.grammar))  # strings that must not hold "</..."
    assert loops and all(ord("<") in f for _, _, f in loops.values())


@pytest.mark.parametrize(
    ("data", "plain"),
    [
        (b"hello", 1),
        (" wörld".encode(), 1),
        (b'a"b', 0),  # a quote ends the string
        (b"\\n", 0),  # an escape
        (b"a\nb", 0),  # a raw control character
        (b"\xc3", 0),  # half a character
        ("🙂".encode(), 1),
        (b"_x", 1),
        (b"", 0),  # a special token
    ],
)
def test_plain_tokens_are_whole_characters_of_the_class(data, plain):
    tables = PlainTables([b"pad", data], 2)
    ranges = ((0, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\")))
    assert tables.table(ranges, True, frozenset({ord('"'), ord("\\")}))[1] == plain
    # the first character of another alternative (an end tag's "<") is not plain
    excluded = tables.table(((0x20, 0x10FFFF),), False, frozenset({ord("_")}))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    assert excluded[1] == (bool(text) and all(" " <= c != "_" for c in text))
