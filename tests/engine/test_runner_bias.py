"""The built-in models' per-token tables (`engine_core.runners.base`), computed over
all tokens at once, against their definitions token by token, on every bundled
vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from engine_core.runners.base import byte_counts, closing_bias
from tokenization import BUNDLED, load_tokenizer

CLOSERS = (b'"', b"'", b"}", b"]", b")", b"@")


@pytest.fixture(scope="module", params=sorted(BUNDLED))
def tok(request):
    return load_tokenizer(request.param)


def test_closing_bias_follows_its_definition(tok):
    bias = closing_bias(tok, 2.5)
    want = np.zeros(tok.vocab_rows, np.float32)
    for tid, b in enumerate(tok.all_token_bytes):
        if b and any(c in b for c in CLOSERS):
            want[tid] = 2.5
        elif b and not b.strip():
            want[tid] = -2.5
    for text, tid in tok.special_tokens.items():
        if text.startswith("</") or "end" in text.lower() or "/" in text:
            want[tid] = 2.5
    want[list(tok.stop_token_ids)] = 2.5
    np.testing.assert_array_equal(bias, want)
    assert (bias < 0).any() and (bias > 0).any()
    assert not closing_bias(tok, 0).any()


def test_byte_counts_count_each_tokens_bytes(tok):
    sets = (b"0123456789", b" \t", b"\x80\xff")
    counts = byte_counts(tok, sets)
    tb = tok.all_token_bytes
    for i, chars in enumerate(sets):
        want = [len(b) - len(b.translate(None, chars)) for b in tb]  # deleted: counted
        np.testing.assert_array_equal(counts[i], want)
    np.testing.assert_array_equal(counts[-1], [len(b) for b in tb])
