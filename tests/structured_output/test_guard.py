"""The guard (`structured_output.guard`): whitespace runs bounded outside JSON strings
and no encoded surrogate, on real vocabularies and real xgrammar matchers.

Oracles that do not use the guard's code: a byte-by-byte JSON lexer written here, and
xgrammar's own bounded whitespace (``max_whitespace_cnt``), whose masks the guarded
unbounded grammar must equal exactly."""

from __future__ import annotations

import codecs
import itertools
import json
import random
import threading

import numpy as np
import pytest
import torch
import xgrammar as xgr

from bench.states import REQUIRED_SCHEMA, TOOLS, WEATHER
from structured_output import CompileOptions, GrammarSpec, LocalCompiler, lexing, utf8
from structured_output.bitmask import BitmaskFiller
from structured_output.guard import GuardTable
from structured_output.guide import RequestGuide
from structured_output.structural_tags import prepare_structural_tag
from structured_output.whitespace import bound_in_grammar, json_text
from tests.support.grammars import hermes_tag
from tests.support.processes import thread_cpu_ticks

WS = b" \t\n\r"
HEX_OR_U = {bytes([c]) for c in b"0123456789abcdefABCDEFu"}
LIMITS = (1, 3, 16)


#: per lexical state of `structured_output.lexing`, a text that leaves a JSON lexer there
PREFIX = {
    lexing.OUT: b"",
    lexing.STR: b'"',
    lexing.ESC: b'"\\',
    lexing.U0: b'"\\u',
    lexing.UD1: b'"\\ud',
    lexing.UH2: b'"\\ud8',
    lexing.UH3: b'"\\ud83',
    lexing.PH: b'"\\ud83d',
    lexing.PH1: b'"\\ud83d\\',
    lexing.PH2: b'"\\ud83d\\u',
    lexing.PH3: b'"\\ud83d\\ud',
}


def reference_allows(data: bytes, limit: int, run: int = 0, raw: bool = False) -> bool | None:
    """Whether ``data`` (JSON text from its start, cut anywhere; ``raw``: any text)
    can be a prefix of text in which no run of whitespace outside strings is longer
    than ``limit`` (``run``: whitespace before ``data``), no ``ED`` byte is followed
    by ``A0..BF``, no string holds a raw control character and no ``\\u`` escape
    writes a lone surrogate; raw text: whether
    ``data`` is the start of valid UTF-8 (by Python's own decoder); None for text with
    a malformed escape, which no grammar of JSON lets through. Written apart from the
    guard: escapes are read whole, as code units."""
    if raw:
        return utf8_prefix(data)
    if any(a == 0xED and 0xA0 <= c <= 0xBF for a, c in zip(data, data[1:], strict=False)):
        return False
    in_str, i, high = False, 0, False
    while i < len(data):
        c = data[i]
        if not in_str:
            if c in WS:
                run += 1
                if run > limit:
                    return False
            else:
                run, in_str = 0, c == 0x22
            i += 1
            continue
        if c < 0x20:
            return False  # a raw control character: strict JSON refuses it
        if c != 0x5C:  # not an escape
            if high:
                return False  # a high surrogate followed by anything but its low half
            in_str = c != 0x22
            i += 1
            continue
        esc = data[i + 1 : i + 6]
        if esc[:1] != b"u":
            if (high and esc) or (esc and esc[0] < 0x20):
                return False
            i += 2
            continue
        digits = ""
        for ch in esc[1:].decode("ascii", "replace").lower():
            if ch not in "0123456789abcdef":
                break
            digits += ch
        if len(digits) < 4:
            if len(esc) - 1 > len(digits):
                return None  # a malformed escape: the grammar refuses it, not the guard
            # cut inside the escape: is some completion fine?
            if high:
                return not digits or (digits[0] == "d" and (len(digits) < 2 or digits[1] in "cdef"))
            return not (digits[:1] == "d" and len(digits) > 1 and digits[1] in "cdef")
        unit = int(digits, 16)
        if high != (0xDC00 <= unit <= 0xDFFF):
            return False
        high = 0xD800 <= unit <= 0xDBFF
        i += 6
    return True


def utf8_prefix(data: bytes) -> bool:
    """Whether ``data`` is the start of valid UTF-8: it, or it and up to three more
    continuation bytes, decodes strictly (Python's decoder)."""
    try:  # refuses what is ill-formed before an incomplete end, not always at the end
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return False
    for k in range(4):
        for tail in itertools.product(b"\x80\x8f\x90\x9f\xa0\xbf", repeat=k):
            try:
                (data + bytes(tail)).decode("utf-8")
                return True
            except UnicodeDecodeError:
                pass
    return False


#: per UTF-8 pending state, bytes that leave a text there
PENDING = {
    utf8.DONE: b"",
    utf8.NEED1: b"\xc3",
    utf8.NEED2: b"\xe9",
    utf8.NEED3: b"\xf1",
    utf8.AFTER_E0: b"\xe0",
    utf8.AFTER_ED: b"\xed",
    utf8.AFTER_F0: b"\xf0",
    utf8.AFTER_F4: b"\xf4",
}


def bit(words: np.ndarray, t: int) -> bool:
    return bool(words[t >> 5] >> np.uint32(t & 31) & 1)


@pytest.fixture(scope="module")
def compilers(qwen3):
    return {n: LocalCompiler(qwen3, CompileOptions(max_whitespace=n)) for n in (*LIMITS, 4)}


@pytest.fixture(scope="module")
def unbounded(qwen3):
    """A guard without a whitespace bound: what is refused whatever the bound."""
    return GuardTable(
        qwen3.all_token_bytes, qwen3.vocab_rows, special_ids=qwen3.special_ids, limit=None
    )


@pytest.fixture(scope="module")
def interesting(qwen3) -> list[int]:
    """The tokens that hold whitespace, a quote, a backslash or a byte of a surrogate's
    encoding, that start with a continuation byte or are ill-formed UTF-8."""
    return [
        t
        for t, b in enumerate(qwen3.all_token_bytes)
        if t not in qwen3.special_ids
        and b
        and (
            any(c in b for c in b'\t\n\r"\\\xed')
            or b.count(b" ") > 1
            or 0x80 <= b[0] <= 0xBF
            or not utf8_prefix(b)
            or b[:1] in HEX_OR_U
        )
    ]


@pytest.mark.parametrize("limit", LIMITS)
def test_table_agrees_with_a_byte_lexer(qwen3, compilers, interesting, limit):
    """Every `interesting` token and a sample of the rest, from every lexical state
    and, in raw text, every UTF-8 pending state: the mask and the next state agree with
    the byte lexer above."""
    table = compilers[limit].guard
    tb = qwen3.all_token_bytes
    rng = random.Random(limit)
    tokens = interesting + rng.sample(range(len(tb)), 3000)
    states = [(lexing.OUT, run, utf8.DONE) for run in range(limit + 1)]
    states += [(lex, 0, utf8.DONE) for lex in PREFIX if lex != lexing.OUT]
    states += [(lexing.OUT, 0, utf8.AFTER_ED), (lexing.STR, 0, utf8.AFTER_ED)]
    states += [(lexing.RAW, 0, u) for u in PENDING]
    for lex, run, u in states:
        q = table.state(lex, run, u)
        assert table.decode(q) == (lex, run, u)
        words = table.allowed(q)
        before = PREFIX.get(lex, b"") + PENDING[u]
        for t in tokens:
            b = tb[t]
            if t in qwen3.special_ids or not b:
                continue
            ok = reference_allows(before + b, limit, run, raw=lex == lexing.RAW)
            if ok is None:
                continue
            assert bit(words, t) == ok, (lex, run, u, b)
            if ok:  # the next state: the token's bytes one by one give the same
                assert table.advance(q, t) == table.advance_bytes(q, b), (lex, run, u, b)
        # a special token writes a marker, not bytes: never after an incomplete character
        if lex == lexing.RAW:
            assert all(bit(words, t) == (u == utf8.DONE) for t in qwen3.special_ids)


def _blank_tokens(tok) -> np.ndarray:
    """Per token row: whether it is an ordinary token of whitespace only."""
    blank = np.zeros(tok.vocab_rows, dtype=bool)
    for t, b in enumerate(tok.all_token_bytes):
        blank[t] = bool(b) and not b.strip(WS) and t not in tok.special_ids
    return blank


def _allowed_row(row: torch.Tensor, tok) -> np.ndarray:
    """The ids a mask row allows, stop tokens left out, in order."""
    ids = np.flatnonzero(
        np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[: tok.vocab_rows]
    )
    return ids[~np.isin(ids, tok.stop_token_ids)]


def _strip_bounds(fmt):
    if isinstance(fmt, dict):
        return {k: _strip_bounds(v) for k, v in fmt.items() if k != "max_whitespace_cnt"}
    if isinstance(fmt, list):
        return [_strip_bounds(v) for v in fmt]
    return fmt


def _bounded_twin(lc: LocalCompiler, spec: GrammarSpec, limit: int) -> xgr.CompiledGrammar:
    """``spec`` with its whitespace bounded by xgrammar's own grammar."""
    c = lc.compiler
    if spec.kind.value == "json_schema":
        return c.compile_json_schema(spec.value, any_whitespace=True, max_whitespace_cnt=limit)
    if spec.kind.value == "json_object":
        return c.compile_json_schema(
            '{"type": "object"}', any_whitespace=True, max_whitespace_cnt=limit, strict_mode=False
        )
    tag = json.loads(prepare_structural_tag(json.loads(spec.value), lc.tokenizer.special_tokens))
    return c.compile_structural_tag(json.dumps(bound_in_grammar(tag, limit)))


TWIN_SPECS = {
    "one_tool_schema": GrammarSpec.of("json_schema", json.dumps(WEATHER)),
    "required_8_tools": GrammarSpec.of("json_schema", json.dumps(REQUIRED_SCHEMA)),
    "json_object": GrammarSpec.of("json_object"),
    "hermes_tag": GrammarSpec.of("structural_tag", json.dumps(_strip_bounds(hermes_tag(TOOLS)))),
}


@pytest.mark.parametrize("limit", (1, 16))
@pytest.mark.parametrize("name", list(TWIN_SPECS))
def test_guarded_masks_equal_xgrammars_bounded_whitespace(qwen3, compilers, unbounded, name, limit):
    """Random walks that favour whitespace: at every step the guarded unbounded grammar
    allows exactly what xgrammar's grammar with ``max_whitespace_cnt`` allows, but for
    what only the guard refuses whatever the bound (an encoded surrogate, a lone
    surrogate escape: the masks of a guard without a bound, in the same state)."""
    lc = compilers[limit]
    spec = TWIN_SPECS[name]
    guarded = lc.compile(spec)
    assert guarded.json_text
    twin = _bounded_twin(lc, spec, limit)
    blanks = _blank_tokens(qwen3)
    stops = list(qwen3.stop_token_ids)
    mask = torch.zeros((2, (qwen3.vocab_rows + 31) // 32), dtype=torch.int32)
    rng = random.Random(hash(name) & 0xFFFF ^ limit)
    steps = 0
    for _ in range(8):
        a = lc.matcher(guarded)
        b = xgr.GrammarMatcher(twin, override_stop_tokens=stops)
        for _ in range(60):
            a.fill_next_token_bitmask(mask, 0)
            b.fill_next_token_bitmask(mask, 1)
            ours = np.unpackbits(mask[0].numpy().view(np.uint8), bitorder="little")
            theirs = np.unpackbits(mask[1].numpy().view(np.uint8), bitorder="little").astype(bool)
            lex, _, pending = a.guard.decode(a.guard_state)
            same = unbounded.allowed(unbounded.state(lex, 0, pending))
            theirs &= np.unpackbits(same.view(np.uint8), bitorder="little").astype(bool)
            assert np.array_equal(ours.astype(bool), theirs), (name, steps)
            allowed = np.flatnonzero(ours[: qwen3.vocab_rows])
            spaced = allowed[blanks[allowed]].tolist()
            t = rng.choice(spaced) if spaced and rng.random() < 0.6 else int(rng.choice(allowed))
            if t in stops:
                break
            assert a.accept_token(t) and b.accept_token(t)
            steps += 1
    assert steps > 100


def test_rollback_and_strings_keep_the_state(qwen3, compilers):
    """After any mix of accepted tokens, accepted strings and rollbacks, the state is
    the one a fresh matcher reaches on what remains accepted."""
    lc = compilers[16]
    grammar = lc.compile(GrammarSpec.of("json_object"))
    rng = random.Random(7)
    bm = torch.zeros((1, (qwen3.vocab_rows + 31) // 32), dtype=torch.int32)
    for _ in range(15):
        m = lc.matcher(grammar)
        done: list[int | bytes] = []
        for _ in range(30):
            r = rng.random()
            if r < 0.2 and done:
                n = rng.randint(1, len(done))
                m.rollback(n)
                del done[-n:]
                continue
            m.fill_next_token_bitmask(bm)
            allowed = _allowed_row(bm[0], qwen3).tolist()
            if not allowed:
                break
            t = rng.choice(allowed)
            if r < 0.3:
                assert m.accept_string(qwen3.all_token_bytes[t])
                done.append(qwen3.all_token_bytes[t])
            else:
                assert m.accept_token(t)
                done.append(t)
        fresh = lc.matcher(grammar)
        for item in done:
            if isinstance(item, bytes):
                assert fresh.accept_string(item)
            else:
                assert fresh.accept_token(item)
        assert fresh.guard_state == m.guard_state


def test_the_filler_guards_every_row_as_a_single_fill_does(qwen3, compilers):
    """The batch path (on threads) and the loop path of `BitmaskFiller` give each row
    what the row's own guarded fill gives."""
    lc = compilers[4]
    specs = list(TWIN_SPECS.values()) + [GrammarSpec.of("regex", "[^a]{0,40}")]
    grammars = [lc.compile(s) for s in specs]
    rng = random.Random(3)
    words = (qwen3.vocab_rows + 31) // 32
    one = torch.zeros((1, words), dtype=torch.int32)
    is_blank = np.array([not b.strip(WS) for b in qwen3.all_token_bytes])
    matchers = []
    for i in range(40):
        m = lc.matcher(grammars[i % len(grammars)])
        for _ in range(rng.randrange(20)):
            m.fill_next_token_bitmask(one)
            ids = _allowed_row(one[0], qwen3)
            allowed = ids.tolist()
            if not allowed:
                break
            blanks = ids[is_blank[ids]].tolist()
            t = rng.choice(blanks) if blanks and rng.random() < 0.5 else rng.choice(allowed)
            assert m.accept_token(t)
        matchers.append(m)
    assert len({m.guard_state for m in matchers}) >= 4  # rows in several states
    expected = []
    for m in matchers:
        m.fill_next_token_bitmask(one)
        expected.append(one[0].clone())
    guides = [RequestGuide(None, m) for m in matchers]
    rows = list(range(len(matchers)))
    for threshold in (1, 1000):
        filler = BitmaskFiller(len(rows), qwen3.vocab_rows, batch_threshold=threshold)
        filler.guard = lc.guard
        filled = filler.fill(rows, guides)
        for r in rows:
            assert torch.equal(filled.buffer[r], expected[r]), (threshold, r)
        assert set(filled.rows.tolist()) == set(rows)
        if threshold == 1:  # the threaded path: its helper thread took chunks
            helpers = [t for t in threading.enumerate() if t.name.startswith("thinkgate-fill-")]
            assert helpers, "the threaded fill started no helper thread"
            ticks = sum(thread_cpu_ticks(t.native_id) for t in helpers)
            for _ in range(300):  # until a clock tick shows the helpers' work
                filler.fill(rows, guides)
                if sum(thread_cpu_ticks(t.native_id) for t in helpers) > ticks:
                    break
            assert sum(thread_cpu_ticks(t.native_id) for t in helpers) > ticks
        filler.close()


@pytest.mark.parametrize("limit", [1, 16])
def test_apply_one_ands_the_states_mask_and_never_empties_a_row(compilers, limit):
    """In every state, for a grammar that refuses raw control characters or not: a
    row ends as itself AND the state's mask, unless that allows nothing where a row
    can end so (`test_guard_build` checks where: then it keeps the grammar's mask);
    other rows are untouched."""
    table = compilers[limit].guard
    rng = np.random.default_rng(7)
    rows = rng.integers(0, 1 << 32, (3, table.words), dtype=np.uint64).astype(np.uint32)
    for q in range(len(table.needs)):
        for lenient in (False, True):
            want_mask = table.allowed(q, lenient)
            for r in range(3):
                view = rows.copy()
                if r == 2:  # only what the state bans, where it bans anything
                    view[r] = ~want_mask if (~want_mask).any() else view[r]
                before = view.copy()
                has = table.apply_one(view, r, q, lenient)
                assert has == bool((~want_mask).any()), (q, lenient)
                anded = before[r] & want_mask
                key = q + len(table.needs) * lenient
                kept = not anded.any() and table._may_empty_list[key]
                assert np.array_equal(view[r], before[r] if kept else anded), (q, r)
                assert np.array_equal(np.delete(view, r, 0), np.delete(before, r, 0))


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec.of("json_schema", '{"type": "string"}'),
        GrammarSpec.of("regex", "[^a]+"),
        GrammarSpec.of("grammar", 'root ::= [^"]+ "!"'),
    ],
    ids=lambda s: s.kind.value,
)
def test_no_surrogate_after_a_token_that_ends_with_ed(qwen3, compilers, spec):
    """Steered into ``ED`` as the last byte of a token: the grammar alone would take
    ``A0..BF`` next (an encoded surrogate); the guard allows only ``80..9F``, and
    Hangul written across the two steps (U+D7A3, ``ED 9E A3``) goes through."""
    lc = compilers[16]
    grammar = lc.compile(spec)
    by_bytes = {b: t for t, b in enumerate(qwen3.all_token_bytes)}
    ed, a0, x9e = by_bytes[b"\xed"], by_bytes[b"\xa0"], by_bytes[b"\x9e"]
    m = lc.matcher(grammar)
    if spec.kind.value == "json_schema":
        assert m.accept_token(by_bytes[b'"'])
    assert m.accept_token(ed)
    plain = xgr.GrammarMatcher(grammar)
    if spec.kind.value == "json_schema":
        plain.accept_token(by_bytes[b'"'])
    plain.accept_token(ed)
    assert plain.accept_token(a0)  # what the guard is for
    bm = torch.zeros((1, (qwen3.vocab_rows + 31) // 32), dtype=torch.int32)
    m.fill_next_token_bitmask(bm)
    words = bm[0].numpy().view(np.uint32)
    starts_hi = [
        t
        for t, b in enumerate(qwen3.all_token_bytes)
        if b and 0xA0 <= b[0] <= 0xBF and t not in qwen3.special_ids
    ]
    assert starts_hi and not any(bit(words, t) for t in starts_hi)
    assert bit(words, x9e)
    assert m.accept_token(x9e) and m.accept_token(by_bytes[b"\xa3"])
    assert m.guard.decode(m.guard_state)[2] == utf8.DONE  # a whole character


def test_no_lone_surrogate_escape(qwen3, compilers):
    """Steered into ``\\ud83d`` (a high surrogate escape): only its low half may follow,
    so the string cannot close; ``\\udc00`` alone (a low one) cannot be started; a
    whole pair and an ordinary ``\\ud7ff`` go through."""
    lc = compilers[16]
    grammar = lc.compile(GrammarSpec.of("json_schema", '{"type": "string"}'))
    by_bytes = {b: t for t, b in enumerate(qwen3.all_token_bytes)}
    quote, backslash, u, d, c, eight = (by_bytes[x] for x in (b'"', b"\\", b"u", b"d", b"c", b"8"))

    def walk(text: bytes):
        m = lc.matcher(grammar)
        for ch in text:
            t = by_bytes[bytes([ch])]
            assert t in _allowed(qwen3, m), text
            assert m.accept_token(t)
        return m

    high = walk(b'"\\ud83d')
    assert quote not in _allowed(qwen3, high) and backslash in _allowed(qwen3, high)
    assert xgr.GrammarMatcher(grammar).accept_string(b'"\\ud83d"')  # the grammar alone would
    m = walk(b'"\\ud83d\\')
    assert _allowed(qwen3, m) & {u, by_bytes[b"n"]} == {u}
    m = walk(b'"\\ud83d\\ud')
    assert c in _allowed(qwen3, m) and eight not in _allowed(qwen3, m)
    walk(b'"\\ud83d\\ude00\\ud7ff"')
    m = walk(b'"\\u')
    assert d in _allowed(qwen3, m)
    m = walk(b'"\\ud')
    assert eight in _allowed(qwen3, m) and c not in _allowed(qwen3, m)


def test_spaces_inside_strings_are_not_counted(qwen3, compilers):
    lc = compilers[3]
    m = lc.matcher(lc.compile(GrammarSpec.of("json_schema", '{"type": "string"}')))
    for t in qwen3.encode('"' + " " * 40 + "x" + " " * 9):
        assert t in _allowed(qwen3, m)
        assert m.accept_token(t)
    assert m.guard.decode(m.guard_state) == (lexing.STR, 0, utf8.DONE)  # inside, no run


def test_whitespace_the_grammar_requires_goes_through(qwen3, compilers):
    """A literal with a longer run than the limit: the row would allow nothing, so it
    keeps its grammar's mask, and the output can still end."""
    lc = compilers[3]
    tag = {"type": "sequence", "elements": [{"type": "json_schema", "json_schema": {}}]}
    tag["elements"].append({"type": "const_string", "value": " " * 8 + "end"})
    grammar = lc.compile(GrammarSpec.of("structural_tag", json.dumps(tag)))
    assert grammar.json_text
    m = lc.matcher(grammar)
    for t in qwen3.encode("1" + " " * 8 + "end", special=False):
        assert t in _allowed(qwen3, m) or all(b in WS for b in qwen3.all_token_bytes[t])
        assert m.accept_token(t)
    assert m.is_completed()


def test_free_text_tags_keep_the_bound_in_their_grammar(qwen3, compilers):
    """A tag with free text is not JSON text: its JSON values carry the bound."""
    lc = compilers[3]
    text = {"type": "tag", "begin": "<t>", "content": {"type": "any_text"}, "end": "</t>"}
    tag = {
        "type": "sequence",
        "elements": [text, {"type": "json_schema", "json_schema": {"type": "object"}}],
    }
    grammar = lc.compile(GrammarSpec.of("structural_tag", json.dumps(tag)))
    assert not grammar.json_text
    for spaces, ok in ((3, True), (4, False)):
        m = xgr.GrammarMatcher(grammar)
        assert m.accept_string('<t>say "hi</t>{' + " " * spaces + "}") is ok


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "const_string", "value": '{"name": "f", "arguments": '}, True),
        ({"type": "const_string", "value": '{"name": "f'}, False),
        ({"type": "regex", "pattern": "(0|[1-9][0-9]{0,3})"}, True),
        ({"type": "regex", "pattern": "[A-z]+"}, False),  # the range holds a backslash
        ({"type": "regex", "pattern": "[^,]+"}, False),
        ({"type": "regex", "pattern": "\\d+"}, False),
        ({"type": "any_text"}, False),
        ({"type": "tag", "begin": "<a>", "content": {"type": "json_schema"}, "end": "</a>"}, True),
        ({"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}, False),
        ({"type": "triggered_tags", "triggers": ["<"], "tags": []}, False),
    ],
)
def test_json_text_classification(fmt, expected):
    assert json_text(fmt) is expected


def _allowed(tok, matcher) -> set[int]:
    bm = torch.zeros((1, (tok.vocab_rows + 31) // 32), dtype=torch.int32)
    matcher.fill_next_token_bitmask(bm)
    bits = np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")[: tok.vocab_rows]
    return set(np.flatnonzero(bits).tolist())


def test_states_start_outside_strings(compilers):
    table = compilers[16].guard
    assert table.decode(table.start_json) == (lexing.OUT, 0, utf8.DONE)
    assert table.decode(table.start_raw) == (lexing.RAW, 0, utf8.DONE)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": 8},
        {"type": "string", "minLength": 2},
        {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}},
    ],
    ids=["maxLength", "minLength", "nested"],
)
def test_no_raw_control_character_inside_strings(qwen3, compilers, schema):
    """xgrammar's length-bounded strings allow raw control characters (a tab, say),
    which strict JSON parsers refuse: the guard bans every token that would write one
    inside a string. Random walks through the masks then always give strict JSON."""
    lc = compilers[16]
    grammar = lc.compile(GrammarSpec.of("json_schema", json.dumps(schema)))
    by_bytes = {b: t for t, b in enumerate(qwen3.all_token_bytes)}
    plain = xgr.GrammarMatcher(grammar)
    assert plain.accept_string('{"a": "' if "properties" in schema else '"')
    assert plain.accept_token(by_bytes[b"\t"])  # what the guard is for
    m = lc.matcher(grammar)
    assert m.accept_string('{"a": "' if "properties" in schema else '"')
    allowed = _allowed(qwen3, m)
    # tokens with a raw control byte before any quote or backslash: still inside
    controls = [
        t
        for t, b in enumerate(qwen3.all_token_bytes)
        if t not in qwen3.special_ids and any(x < 0x20 for x in b.split(b'"')[0].split(b"\\")[0])
    ]
    assert controls and not allowed.intersection(controls)
    assert allowed - {by_bytes[b'"']}  # the string may still go on
    rng = np.random.default_rng(7)
    bm = torch.zeros((1, (qwen3.vocab_rows + 31) // 32), dtype=torch.int32)
    ended = 0
    for _ in range(6):
        m = lc.matcher(grammar)
        out = []
        for _ in range(30):
            if m.is_terminated():
                break
            m.fill_next_token_bitmask(bm)
            bits = np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")
            ids = np.flatnonzero(bits[: qwen3.vocab_rows])
            t = int(ids[rng.integers(len(ids))])
            assert m.accept_token(t)
            if t not in qwen3.stop_token_ids:
                out.append(t)
        if m.is_terminated():
            ended += 1
            json.loads(qwen3.decode(out))  # strict: raw control characters are errors
    assert ended or "maxLength" not in schema
