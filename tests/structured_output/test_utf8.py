"""The guard's UTF-8 rule (`structured_output.utf8`, rule 2 of `structured_output.guard`)
on every bundled vocabulary: what it lets through is valid UTF-8 wherever a character
is complete, and it never bans a token of a valid text's own tokenization.

Oracles apart from the guard: Python's strict UTF-8 decoder, the vocabularies' own
encoders, and real xgrammar matchers."""

from __future__ import annotations

import codecs
import json
import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from structured_output import CompileOptions, GrammarSpec, LocalCompiler, lexing, utf8
from structured_output.guard import GuardTable
from tokenization import BUNDLED, load_tokenizer

VOCABS = sorted(BUNDLED)
#: texts of many scripts, characters of 1 to 4 bytes, split between tokens in every way
REAL = [
    "naïve café — 東京タワーの夜景 🌃",
    "Привет, мир! Ελληνικά: αβγ. עברית ومرحبا",
    "emoji: 👩‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 ✊🏿",
    "math 𝔸𝔹ℂ ∮ E⋅da = Q,  n → ∞, ∑ f(i) = ∏ g(i)",
    "한국어 텍스트와 中文混合 text, tiếng Việt có dấu",
    "combining: e\u0301 a\u0308 \u0915\u094d\u0937 \ufeff\u200b",
    "\U0010fffd\U00010000\u07ff\u0800\uffff\ud7ff\ue000",
]


@pytest.fixture(scope="module", params=VOCABS)
def vocab(request):
    tok = load_tokenizer(request.param)
    lc = LocalCompiler(tok, CompileOptions(max_whitespace=16))
    return tok, lc.guard, lc


def _allowed(table: GuardTable, q: int, rows: int) -> np.ndarray:
    bits = np.unpackbits(table.allowed(q).view(np.uint8), bitorder="little")[:rows]
    return np.flatnonzero(bits)


def _is_prefix(data: bytes) -> bool:
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return False
    return True


def test_random_walks_through_the_table_stay_valid_utf8(vocab):
    """Tokens drawn from the raw-text masks, most of them with bytes past ASCII (half of
    those ending mid-character): the text decodes strictly whenever no character is
    pending, is never ill-formed before its end, and a special token comes only after
    a whole character."""
    tok, table, _ = vocab
    tb = tok.all_token_bytes
    specials = set(tok.special_ids)
    special = np.zeros(len(tb), bool)
    special[list(specials)] = True
    wide = np.zeros(tok.vocab_rows, bool)
    wide[[t for t, b in enumerate(tb[: tok.vocab_rows]) if not b.isascii()]] = True
    cut = np.zeros(tok.vocab_rows, bool)  # tokens that end mid-character
    cut[[t for t, b in enumerate(tb) if utf8.run_bytes(utf8.DONE, b) not in (0, utf8.ERROR)]] = True
    rng = random.Random(tok.vocab_rows)
    pending_seen = whole_seen = 0
    for _ in range(30):
        q, data = table.start_raw, b""
        for _ in range(40):
            allowed = _allowed(table, q, len(tb))  # not the padding rows past the tokens
            assert len(allowed), data
            pending = table.decode(q)[2]
            assert pending == utf8.DONE or not special[allowed].any()
            r = rng.random()
            pick = allowed[cut[allowed]] if r < 0.4 else allowed[wide[allowed]] if r < 0.8 else []
            t = int(rng.choice(pick if len(pick) else allowed))
            q = table.advance(q, t)
            data += b"" if t in specials else tb[t]
            if table.decode(q)[2] == utf8.DONE:
                data.decode("utf-8")  # strict: raises on anything ill-formed
                whole_seen += 1
            else:
                assert _is_prefix(data), data[-12:]
                pending_seen += 1
    assert pending_seen > 150 and whole_seen > 150  # the walks did go mid-character


def _walk(table: GuardTable, q: int, ids: list[int]) -> int:
    for i, t in enumerate(ids):
        words = table.allowed(q)
        assert words[t >> 5] >> np.uint32(t & 31) & 1, (i, t)
        q = table.advance(q, t)
    return q


@given(text=st.text(st.characters(exclude_categories=("Cs",)), max_size=40))
@example(text="".join(REAL))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_valid_texts_own_tokens_are_never_masked(vocab, text):
    """A valid text as the vocabulary encodes it (characters split between tokens
    wherever its merges split them), as raw text and inside a JSON string: every token
    is allowed where it comes, and the state ends whole."""
    tok, table, _ = vocab
    ids = tok.encode(text, special=False)
    q = _walk(table, table.start_raw, ids)
    assert table.decode(q) == (lexing.RAW, 0, utf8.DONE)
    ids = tok.encode(json.dumps(text, ensure_ascii=False), special=False)
    q = _walk(table, table.start_json, ids)
    assert table.decode(q) == (lexing.OUT, 0, utf8.DONE)


@pytest.mark.parametrize("text", REAL)
def test_real_texts_are_never_masked(vocab, text):
    tok, table, _ = vocab
    q = _walk(table, table.start_raw, tok.encode(text, special=False))
    assert table.decode(q)[2] == utf8.DONE


ANY_TEXT = {"type": "tag", "begin": "<p>", "content": {"type": "any_text"}, "end": "</p>"}
SPECS = {
    "any_text": GrammarSpec.of("structural_tag", json.dumps(ANY_TEXT)),
    "json_string": GrammarSpec.of("json_schema", '{"type": "string"}'),
    "json_object": GrammarSpec.of("json_object"),
    "regex": GrammarSpec.of("regex", "[^<]{0,60}<"),
    "grammar": GrammarSpec.of("grammar", 'root ::= [^"]* "!"'),
}


@pytest.mark.parametrize("kind", list(SPECS))
def test_every_spec_kind_writes_valid_utf8(vocab, kind):
    """Real xgrammar matchers, guarded as the engine guards them, of a byte-level
    region (``any_text``: the guard does all), JSON text and character classes (the
    grammar refuses all but surrogates, the guard those): random walks that favour
    bytes past ASCII decode strictly whenever no character is pending."""
    tok, _, lc = vocab
    grammar = lc.compile(SPECS[kind])
    tb = tok.all_token_bytes
    wide = np.zeros(tok.vocab_rows, bool)
    wide[[t for t, b in enumerate(tb[: tok.vocab_rows]) if not b.isascii()]] = True
    stops = set(tok.stop_token_ids)
    bm = torch.zeros((1, (tok.vocab_rows + 31) // 32), dtype=torch.int32)
    rng = random.Random(len(kind))
    checked = 0
    for _ in range(12):
        m = lc.matcher(grammar)
        data = b""
        for _ in range(40):
            m.fill_next_token_bitmask(bm)
            bits = np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")
            allowed = np.flatnonzero(bits[: tok.vocab_rows])
            pick = allowed[wide[allowed]] if rng.random() < 0.8 else allowed
            t = int(rng.choice(pick if len(pick) else allowed))
            if t in stops:
                break
            assert m.accept_token(t)
            data += tb[t] if t not in tok.special_ids else b""
            if m.guard.decode(m.guard_state)[2] == utf8.DONE:
                data.decode("utf-8")
                checked += 1
    assert checked > 50
