"""Log-probabilities for the requests that ask for them.

A step with no such request does nothing here. Otherwise, before the sampler edits the
logits in place, `StepLogprobs.gather` copies the asking rows only, takes their
log-normaliser and their likeliest ids in one batched call each; after sampling,
`StepLogprobs.record` reads the sampled tokens' values and appends one entry per row to
its request's `LogprobBuffer`. The values are the model's own distribution: the
logits before the grammar's mask, temperature, top-k and top-p.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ipc import TokenLogprobs

if TYPE_CHECKING:
    from .request import EngineRequest


class LogprobBuffer:
    """One request's log-probabilities of the tokens not sent yet."""

    __slots__ = ("top_n", "sampled", "top_ids", "top_logprobs")

    def __init__(self, top_n: int) -> None:
        self.top_n = top_n
        self.sampled: list[float] = []
        self.top_ids: list[list[int]] = []
        self.top_logprobs: list[list[float]] = []

    def take(self) -> TokenLogprobs:
        """The entries gathered since the last call (one per token sent with them)."""
        out = TokenLogprobs(self.sampled, self.top_ids, self.top_logprobs)
        self.sampled, self.top_ids, self.top_logprobs = [], [], []
        return out


class StepLogprobs:
    """The asking rows of one step's logits, read before sampling."""

    __slots__ = ("rows", "requests", "_x", "_lse", "_top_ids", "_top_lp")

    def __init__(self, rows: list[int], requests: list[EngineRequest]) -> None:
        self.rows = rows
        self.requests = requests

    @classmethod
    def gather(cls, logits: torch.Tensor, batch: Sequence[EngineRequest]) -> StepLogprobs | None:
        """Copy what the asking rows of ``logits`` ``[n, vocab]`` need; None when no row
        asks."""
        rows = [i for i, r in enumerate(batch) if r.logprobs is not None]
        if not rows:
            return None
        step = cls(rows, [batch[i] for i in rows])
        idx = torch.tensor(rows, device=logits.device)
        x = logits.index_select(0, idx).float()
        lse = torch.logsumexp(x, dim=1)
        k = max(r.logprobs.top_n for r in step.requests)  # type: ignore[union-attr]
        if k:
            vals, ids = torch.topk(x, min(k, x.shape[1]), dim=1)
            step._top_ids = ids.cpu().numpy()
            step._top_lp = (vals - lse.unsqueeze(1)).cpu().numpy()
        else:
            step._top_ids = step._top_lp = None
        step._x = x
        step._lse = lse
        return step

    def record(self, tokens: np.ndarray) -> None:
        """Append each asking row's entry for its sampled token (``tokens`` holds every
        row's token, -1 where a row allowed nothing: such a row ends, with no entry)."""
        rows = self.rows
        tok = tokens[rows]
        safe = torch.from_numpy(np.maximum(tok, 0)).to(self._x.device)
        arange = torch.arange(len(rows), device=self._x.device)
        sampled = (self._x[arange, safe] - self._lse).cpu().tolist()
        for j, r in enumerate(self.requests):
            if tok[j] < 0:
                continue
            buf = r.logprobs
            assert buf is not None
            buf.sampled.append(sampled[j])
            n = buf.top_n
            if n and self._top_ids is not None:
                buf.top_ids.append(self._top_ids[j, :n].tolist())
                buf.top_logprobs.append(self._top_lp[j, :n].tolist())
            else:
                buf.top_ids.append([])
                buf.top_logprobs.append([])
