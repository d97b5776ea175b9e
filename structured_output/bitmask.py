"""Persistent token-bitmask buffers and the batched fill.

Bit ``j`` of word ``w`` of a row allows token ``32 * w + j``. Buffers are allocated
once, for the largest batch; on CUDA they are pinned and double-buffered, so that one
step's host-to-device copy can still be in flight while the next step is filled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from .guide import RequestGuide


def bitmask_words(vocab_rows: int) -> int:
    return (vocab_rows + 31) // 32


class FilledMask:
    """The result of one fill: ``buffer[rows]`` hold the masks of those batch rows."""

    __slots__ = ("buffer", "rows")

    def __init__(self, buffer: torch.Tensor, rows: np.ndarray) -> None:
        self.buffer = buffer
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)


class BitmaskFiller:
    """Fills the rows of the batch whose grammar is active, in one batched call.

    Below ``batch_threshold`` rows a plain loop over the matchers is used (xgrammar's
    batch call starts a thread pool per call, which costs more than small batches
    gain); the loop also learns which rows restrict nothing and skips them.
    """

    def __init__(
        self,
        max_rows: int,
        vocab_rows: int,
        *,
        pin_memory: bool = False,
        num_buffers: int = 1,
        batch_threshold: int = 64,
        max_threads: int = 2,
    ) -> None:
        import xgrammar as xgr

        self.vocab_rows = vocab_rows
        self.words = bitmask_words(vocab_rows)
        self.buffers = [
            torch.full((max_rows, self.words), -1, dtype=torch.int32, pin_memory=pin_memory)
            for _ in range(max(1, num_buffers))
        ]
        self._views = [b.numpy().view(np.uint32) for b in self.buffers]
        self._next = 0
        self.batch_threshold = batch_threshold
        self._batch = xgr.BatchGrammarMatcher(max_threads=max_threads)

    def fill(self, rows: Sequence[int], guides: Sequence[RequestGuide]) -> FilledMask:
        """Fill ``rows`` from ``guides`` (same order; each with an active grammar): the
        grammar's mask plus the guide's `extra_allowed`, or those extra ids alone where
        the guide does not follow its grammar this step."""
        k = self._next
        self._next = (k + 1) % len(self.buffers)
        buf, view = self.buffers[k], self._views[k]
        if not rows:
            return FilledMask(buf, np.empty(0, dtype=np.int64))
        if len(rows) >= self.batch_threshold:
            matchers = [g.matcher for g in guides]
            self._batch.batch_fill_next_token_bitmask(matchers, buf, list(rows))
            active = list(rows)
        else:
            active = [
                r
                for r, g in zip(rows, guides, strict=True)
                if g.matcher.fill_next_token_bitmask(buf, r)
            ]
        alone: list[int] = []  # rows whose mask is their extra ids alone
        for r, g in zip(rows, guides, strict=True):
            extra = g.extra_allowed()
            if not g.follows_grammar:
                view[r] = 0
                alone.append(r)
            if extra:
                ids = np.asarray(extra, dtype=np.int64)
                np.bitwise_or.at(view[r], ids >> 5, np.left_shift(1, ids & 31).astype(np.uint32))
        filled = np.asarray(active, dtype=np.int64)
        if alone:
            filled = np.union1d(filled, alone)
        return FilledMask(buf, filled)
