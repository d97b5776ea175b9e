"""A model whose logits are random: every step adversarial, so only the mask keeps an
output valid; a closing bias makes its outputs end."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from .base import ModelRunner, RunnerOptions, RunnerRow, closing_bias

#: distinct random logit rows the model draws from
POOL_ROWS = 64


class RandomLogitsRunner(ModelRunner):
    """Each row's logits at each position are one of `POOL_ROWS` fixed random vectors,
    chosen by a hash of the request's ``model_seed`` and the position: reproducible per
    request whatever else is in the batch, and cheap (one gather per step)."""

    def __init__(self, tokenizer, options: RunnerOptions) -> None:
        super().__init__(tokenizer, options)
        rng = np.random.default_rng(options.seed)
        pool = rng.standard_normal((POOL_ROWS, self.vocab_rows), dtype=np.float32)
        pool += closing_bias(tokenizer, options.closing_bias)
        self._pool = torch.from_numpy(pool).to(self.device)
        self._out = torch.empty((options.max_num_seqs, self.vocab_rows), dtype=torch.float32, device=self.device)
        self._index = torch.empty(options.max_num_seqs, dtype=torch.int64)

    def forward(self, rows: Sequence[RunnerRow]) -> torch.Tensor:
        n = len(rows)
        idx = self._index[:n].numpy()
        for i, r in enumerate(rows):
            idx[i] = _mix(r.model_seed, len(r.output_ids)) % POOL_ROWS
        out = self._out[:n]
        torch.index_select(self._pool, 0, self._index[:n].to(self.device), out=out)
        if self.options.forward_ms > 0:
            time.sleep(self.options.forward_ms / 1000)
        return out


def _mix(seed: int, position: int) -> int:
    """A cheap integer hash (splitmix64 finaliser) of (seed, position)."""
    x = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 29)
