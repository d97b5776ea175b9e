"""Reading allowed ids out of mask words, against a bit-by-bit reference."""

from __future__ import annotations

import numpy as np
import pytest

from structured_output.apply import allowed_counts, allowed_ids


def _reference(words: np.ndarray, vocab_rows: int) -> tuple[np.ndarray, np.ndarray]:
    rows, tokens = [], []
    for r, row in enumerate(words):
        for w, value in enumerate(row):
            for j in range(32):
                t = 32 * w + j
                if int(value) >> j & 1 and t < vocab_rows:
                    rows.append(r)
                    tokens.append(t)
    return np.asarray(rows, dtype=np.int64), np.asarray(tokens, dtype=np.int64)


@pytest.mark.parametrize("width", [1, 2, 7, 10])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.3, 1.0])
def test_allowed_ids_match_the_bits_for_odd_and_even_widths(width, density):
    rng = np.random.default_rng(width * 100 + int(density * 10))
    bits = rng.random((6, width * 32)) < density
    words = np.packbits(bits, axis=1, bitorder="little").view(np.uint32)
    vocab_rows = width * 32 - 5  # the last word's top bits lie beyond the vocabulary
    rows, tokens = allowed_ids(words, vocab_rows)
    want_rows, want_tokens = _reference(words, vocab_rows)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(tokens, want_tokens)
    assert rows.dtype == tokens.dtype == np.int64
    counts = allowed_counts(words)
    np.testing.assert_array_equal(counts, bits.sum(axis=1))


def test_allowed_ids_of_rows_picked_from_a_larger_buffer():
    """The sampler passes rows gathered from the engine's buffer (a copy, contiguous)
    and, elsewhere, strided slices: both read the same."""
    rng = np.random.default_rng(7)
    buf = rng.integers(0, 2**32, size=(9, 12), dtype=np.uint32)
    buf[rng.random(buf.shape) < 0.7] = 0
    picked = buf[[1, 4, 8]]
    strided = buf[::3]
    for words in (picked, strided, buf[:, :11]):
        rows, tokens = allowed_ids(words, words.shape[1] * 32)
        want = _reference(np.ascontiguousarray(words), words.shape[1] * 32)
        np.testing.assert_array_equal(rows, want[0])
        np.testing.assert_array_equal(tokens, want[1])
        counts = np.bincount(rows, minlength=len(words))
        np.testing.assert_array_equal(allowed_counts(words), counts)
