"""Applying token bitmasks to logits.

On a GPU the mask is applied in place by xgrammar's kernel. On a CPU, masking and
sampling the full vocabulary cost far more than filling the mask, while most
constrained rows allow under 1% of it; so a CPU row that allows few tokens is turned
into its list of allowed ids, and only those logits are ever touched.
"""

from __future__ import annotations

import numpy as np
import torch

_SHIFTS = np.arange(32, dtype=np.uint32)


def allowed_ids(words: np.ndarray, vocab_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The allowed ids of several mask rows.

    ``words``: uint32 ``[m, W]``. Returns ``(row, token)`` int64 arrays, sorted by row
    then token: row ``row[i]`` allows ``token[i]``. Cost is proportional to the rows'
    size in words plus the number of allowed ids.
    """
    r, w = np.nonzero(words)
    if len(r) == 0:
        return r.astype(np.int64), w.astype(np.int64)
    vals = words[r, w]
    bits = ((vals[:, None] >> _SHIFTS) & 1).astype(bool)
    tokens = (w.astype(np.int64)[:, None] * 32 + _SHIFTS.astype(np.int64))[bits]
    rows = np.repeat(r.astype(np.int64), bits.sum(axis=1))
    keep = tokens < vocab_rows
    return rows[keep], tokens[keep]


def allowed_counts(words: np.ndarray) -> np.ndarray:
    """Per row of uint32 ``[m, W]`` mask words, the number of allowed ids."""
    return np.bitwise_count(words).sum(axis=1, dtype=np.int64)


def apply_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor, rows: np.ndarray) -> None:
    """``logits[rows[i], j] = -inf`` where bit ``j`` of ``bitmask[rows[i]]`` is 0, with
    xgrammar's kernel (``bitmask`` on the logits' device, ``[>= max(rows) + 1, W]``)."""
    import xgrammar as xgr

    if len(rows) == 0:
        return
    xgr.apply_token_bitmask_inplace(
        logits, bitmask, vocab_size=logits.shape[-1], indices=rows.tolist()
    )
