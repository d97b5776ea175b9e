"""The guard table's build (`structured_output.guard.GuardTable`, `lexing.lex_tokens`,
`utf8.token_states`) against a reference builder written here the plain way: every
token lexed byte by byte in Python from every state, and every state's mask computed
from those facts one state at a time. The vectorized build must agree with it exactly:
every transition code, every mask, and the layout `apply` reads (which states need a
mask, which are whole rows, the sparse words and their padded copy).

Lexing every token of a vocabulary in Python costs seconds; tokens whose bytes no
automaton tells apart (same class of every byte under both transition tables and the
whitespace set) have the same facts, so the reference lexes one token of each such
spelling. Facts that name a byte itself (the first byte, an encoded surrogate) are
read from the real bytes."""

from __future__ import annotations

import random
import re
from typing import Any

import numpy as np
import pytest

from structured_output import lexing, utf8
from structured_output.guard import GuardTable
from structured_output.lexing import CTRL, ESCAPING, INVALID, NARROW, NUM_STATES, OUT, RAW, STR
from structured_output.utf8 import AFTER_ED, DONE, ERROR, NUM_PENDING
from tokenization import BUNDLED, load_tokenizer

LIMITS = (None, 0, 1, 16)
WS = b" \t\n\r"
SURROGATE = re.compile(b"\xed[\xa0-\xbf]")


#: ``NEXT[state][byte]``: `lexing.step` as nested lists, for speed
NEXT = [[lexing.step(s, b) for b in range(256)] for s in range(NUM_STATES)]


def lex_one(b: bytes, s: int) -> tuple[int, int, int, int, bool, bool, bool, bool]:
    """``(next, lead, inner, trail, pure, invalid, ctrl, left)`` of token ``b`` from
    lexical state ``s``: a lone surrogate escape or a raw control character in a string
    ends in ``STR``, invalid (``ctrl`` for the latter), with no runs; ``left``: the text
    is outside strings before, between or after its bytes, or it is invalid."""
    run = lead = inner = 0
    only_ws = left = s == OUT
    for byte in b:
        if s == OUT and byte in WS:
            run += 1
            continue
        if s == OUT:
            if only_ws:
                lead = run
            else:
                inner = max(inner, run)
            run = 0
        only_ws = False
        s = NEXT[s][byte]
        if s >= INVALID:
            return STR, 0, 0, 0, False, True, s == CTRL, True
        left |= s == OUT
    if only_ws:
        return s, run, 0, run, run > 0, False, False, left
    return s, lead, max(inner, run), run if s == OUT else 0, False, False, False, left


def _spelling() -> bytes:
    """A translation table: each byte to the least byte that no table tells apart."""
    columns = {}
    out = bytearray(256)
    for byte in range(256):
        key = (
            tuple(lexing.step(s, byte) for s in range(NUM_STATES)),
            tuple(utf8.step(u, byte) for u in range(NUM_PENDING)),
            byte in WS,
        )
        out[byte] = columns.setdefault(key, byte)
    return bytes(out)


def reference_facts(tb: list[bytes]) -> dict[str, Any]:
    """Per lexical state and token, `lex_one`; per pending state and token, the
    pending state after the token (`utf8.run_bytes`); per token its length, first
    byte and whether it holds ``ED A0..BF``."""
    spelled = _spelling()
    kinds: dict[bytes, int] = {}
    kind = np.array([kinds.setdefault(b.translate(spelled), len(kinds)) for b in tb], np.int64)
    raw = (RAW, 0, 0, 0, False, False, False, False)  # raw text is not lexed
    lexed = np.array(  # [kinds, states, 8]
        [[raw if s == RAW else lex_one(key, s) for s in range(NUM_STATES)] for key in kinds],
        np.int64,
    ).reshape(len(kinds), NUM_STATES, 8)
    pending = np.array([[utf8.run_bytes(u, key) for u in range(NUM_PENDING)] for key in kinds])
    facts: dict[str, Any] = {}
    names = ("next", "lead", "inner", "trail", "pure", "invalid", "ctrl", "left")
    for i, name in enumerate(names):
        facts[name] = lexed[kind, :, i].T
    for name in ("pure", "invalid", "ctrl", "left"):
        facts[name] = facts[name].astype(bool)
    facts["pending"] = pending.reshape(len(kinds), NUM_PENDING)[kind].T
    facts["len"] = np.array([len(b) for b in tb])
    facts["first"] = np.array([b[0] if b else 0 for b in tb])
    facts["surrogate"] = np.array([SURROGATE.search(b) is not None for b in tb])
    facts["single_bytes"] = len({b for b in tb if len(b) == 1})
    return facts


def _pack(ok: np.ndarray, words: int) -> np.ndarray:
    bits = np.ones(words * 32, bool)
    bits[: len(ok)] = ok
    return np.packbits(bits, bitorder="little").view(np.uint32)


def check_against_reference(table: GuardTable, facts: dict[str, Any]) -> None:
    """Every code and mask of ``table`` equals what the reference facts give."""
    limit, k, words = table.limit, table.k, table.words
    cap = k - 1
    # transitions: from each (lexical, pending) state, each token's next state
    for s in range(NUM_STATES):
        for u in range(NUM_PENDING):
            row = table.codes[s * NUM_PENDING + u]
            got = np.frombuffer(row, np.int16 if row.typecode == "h" else np.int32)
            if u != DONE and s in ESCAPING:  # unreachable: shares the row of DONE
                assert table.codes[s * NUM_PENDING + u] is table.codes[s * NUM_PENDING]
                continue
            pending = facts["pending"][u]
            pending = np.where(pending == ERROR, DONE, pending)
            want = (facts["next"][s] * NUM_PENDING + pending) * k + np.minimum(
                facts["trail"][s], cap
            )
            if s == OUT and u == DONE:
                want = np.where(facts["pure"][OUT], -facts["len"], want)
            np.testing.assert_array_equal(got, want, err_msg=f"codes of lex {s}, pending {u}")
            leaves = np.frombuffer(table.leaves[s * NUM_PENDING + u], bool)
            np.testing.assert_array_equal(leaves, facts["left"][s], err_msg=f"leaves of lex {s}")
    # masks: one state at a time, for a grammar that may write raw control characters
    # in strings and for one that refuses them by itself (``lenient``)
    starts_hi = (facts["first"] >= 0xA0) & (facts["first"] <= 0xBF)
    complete = facts["single_bytes"] == 256
    n = NUM_STATES * NUM_PENDING * k
    for q in range(n):
        s, run, u = table.decode(q)
        if (run > 0 and (s != OUT or u != DONE)) or (u != DONE and s in ESCAPING):
            assert not table.needs[q] and not table.needs_lenient[q], q  # unreachable
            continue
        ok = ~facts["invalid"][s]
        if s == RAW:
            ok &= facts["pending"][u] != ERROR
        else:
            ok &= ~facts["surrogate"]
            if u == AFTER_ED:
                ok &= ~starts_hi
        if limit is not None and s != RAW:
            ok &= facts["inner"][s] <= limit
            if s == OUT:
                ok &= facts["lead"][OUT] <= limit - run
        ok = np.concatenate((ok, np.ones(table.vocab_rows - len(ok), bool)))
        ctrl = np.concatenate((facts["ctrl"][s], np.zeros(table.vocab_rows - len(ok), bool)))
        for lenient, allowed in ((False, ok), (True, ok | ctrl)):
            key = q + n * lenient
            needs = table.needs_lenient[q] if lenient else table.needs[q]
            assert bool(needs) == (not allowed.all()), (q, s, run, u, lenient)
            if not needs:
                assert table._mask_list[key] is None
                continue
            want = _pack(allowed, words)
            np.testing.assert_array_equal(table.allowed(q, lenient), want, err_msg=f"mask {key}")
            # only these may leave a row with nothing allowed (`apply_one` checks them)
            empty_possible = (
                not complete
                or (s == OUT and limit is not None and run >= limit)
                or s in NARROW
                or (s == RAW and u != DONE)
            )
            assert table._may_empty_list[key] == empty_possible, key
    # each distinct mask is kept once
    assert len({row.tobytes() for row in table._masks}) == len(table._masks)


@pytest.fixture(scope="module", params=sorted(BUNDLED))
def vocab(request):
    tok = load_tokenizer(request.param)
    tb = [b"" if i in tok.special_ids else b for i, b in enumerate(tok.all_token_bytes)]
    tb += [b""] * (tok.vocab_rows - len(tb))
    return tok, reference_facts(tb)


@pytest.mark.parametrize("limit", LIMITS)
def test_the_build_equals_the_reference_on_real_vocabularies(vocab, limit):
    tok, facts = vocab
    table = GuardTable(
        tok.all_token_bytes, tok.vocab_rows, special_ids=tok.special_ids, limit=limit
    )
    check_against_reference(table, facts)


#: bytes that move the automata: whitespace, quotes, escapes and hex digits (the
#: surrogate ones among them), UTF-8 lead bytes of every kind, continuation bytes at
#: the edges of the narrower ranges, and bytes that are never UTF-8
ALPHABET = (
    b' \t\n\r"\\udDcC89aA0fFx\xc2\xc3\xe0\xe1\xed\xf0\xf1\xf4\x80\x8f\x90\x9f\xa0\xbf\xc0\xf5\xff'
)


@pytest.mark.parametrize("seed", range(4))
def test_the_build_equals_the_reference_on_generated_vocabularies(seed):
    """Tokens no real vocabulary has (long whitespace runs, escapes of every kind cut
    anywhere, encoded surrogates, ill-formed UTF-8), holes and special tokens, rows
    past the tokens; vocabularies with every single byte, and without."""
    rng = random.Random(seed)
    print("seed", seed)
    if seed % 2:  # some single bytes: masks that may empty a row are whole rows
        tokens = {bytes([rng.choice(ALPHABET)]) for _ in range(40)}
    else:  # every byte a token: most masks are sparse
        tokens = {bytes([b]) for b in range(256)}
    while len(tokens) < 3000:
        size = rng.choice((1, 2, 3, 4, 6, 8, 12, 24, 40))
        if rng.random() < 0.1:  # whitespace runs, some around a quote
            tokens.add(rng.choice((b"", b'"', b",")) + bytes(rng.choices(WS, k=size)))
        else:
            tokens.add(bytes(rng.choices(ALPHABET, k=size)))
    while len(tokens) < 10000:  # plain words, as most of a real vocabulary
        tokens.add(bytes(rng.choices(b" ghijklmnopqrstvwxyz", k=rng.randint(2, 9))))
    tb = list(tokens)
    rng.shuffle(tb)
    tb[5] = tb[17] = b""  # holes
    specials = set(rng.sample(range(len(tb)), 20))
    rows = len(tb) + rng.choice((0, 1, 31, 77))
    blanked = [b"" if i in specials else b for i, b in enumerate(tb)]
    facts = reference_facts(blanked + [b""] * (rows - len(tb)))
    for limit in (None, 0, 3, 100):  # 100: masks built in blocks of states
        table = GuardTable(tb, rows, special_ids=specials, limit=limit)
        check_against_reference(table, facts)
