"""Applying token bitmasks to logits.

On a GPU the mask is applied in place by xgrammar's kernel. On a CPU, masking and
sampling the full vocabulary cost far more than filling the mask, while most
constrained rows allow under 1% of it; so a CPU row that allows few tokens is turned
into its list of allowed ids, and only those logits are ever touched.
"""

from __future__ import annotations

import numpy as np
import torch


def allowed_ids(words: np.ndarray, vocab_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The allowed ids of several mask rows.

    ``words``: uint32 ``[m, W]``. Returns ``(row, token)`` int64 arrays, sorted by row
    then token: row ``row[i]`` allows ``token[i]``. Cost is proportional to the rows'
    size in words plus the number of allowed ids: one scan for the nonzero words (64
    bits at a time where rows have an even number of words), then the bits of those
    words alone, unpacked as bytes.
    """
    wide = _wide(words)
    flat = wide.reshape(-1)
    at = np.flatnonzero(flat)
    per_word = wide.dtype.itemsize * 8
    # little-endian bit order: bit j of a word is token 32 * word + j
    bits = np.unpackbits(flat[at].view(np.uint8), bitorder="little").view(bool)
    j = np.flatnonzero(bits)
    where = at[j // per_word]
    rows, col = np.divmod(where, wide.shape[1])
    tokens = col * per_word + j % per_word
    keep = tokens < vocab_rows
    return rows[keep], tokens[keep]


def allowed_counts(words: np.ndarray) -> np.ndarray:
    """Per row of uint32 ``[m, W]`` mask words, the number of allowed ids."""
    return np.bitwise_count(_wide(words)).sum(axis=1, dtype=np.int64)


def _wide(words: np.ndarray) -> np.ndarray:
    """Mask rows read 64 bits at a time where they have an even number of words."""
    words = np.ascontiguousarray(words, dtype=np.uint32)
    return words.view(np.uint64) if words.shape[1] % 2 == 0 else words


def apply_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor, rows: np.ndarray) -> None:
    """``logits[rows[i], j] = -inf`` where bit ``j`` of ``bitmask[rows[i]]`` is 0, with
    xgrammar's kernel (``bitmask`` on the logits' device, ``[>= max(rows) + 1, W]``)."""
    import xgrammar as xgr

    if len(rows) == 0:
        return
    xgr.apply_token_bitmask_inplace(
        logits, bitmask, vocab_size=logits.shape[-1], indices=rows.tolist()
    )
