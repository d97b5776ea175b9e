"""The model-runner interface: logits for the batch's rows, on the runner's device."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from tokenization import Tokenizer


class RunnerRow(Protocol):
    """What a runner may read of a running request."""

    request_id: str
    prompt_token_ids: list[int]
    output_ids: list[int]
    #: a per-request integer the runner may use to vary its logits reproducibly
    model_seed: int


@dataclass
class RunnerOptions:
    device: str = "cpu"
    seed: int = 0
    max_num_seqs: int = 256
    #: a fixed cost added to every forward pass, in milliseconds (benchmarks)
    forward_ms: float = 0.0
    #: added to the logits of tokens that close strings, structures and markers, so
    #: that a random model ends its outputs
    closing_bias: float = 3.0
    #: texts that end free text in the formats a test drives (a closing tag spelled
    #: in ordinary tokens, say): a random model leans into writing them once begun
    ending_texts: list[str] = field(default_factory=list)
    script: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


class ModelRunner(ABC):
    """Logits for the next token of each row. ``forward`` runs on the engine's model
    thread, concurrently with the grammar work of the same step."""

    def __init__(self, tokenizer: Tokenizer, options: RunnerOptions) -> None:
        self.tokenizer = tokenizer
        self.options = options
        self.device = torch.device(options.device)
        self.vocab_rows = tokenizer.vocab_rows

    @property
    def name(self) -> str:
        return type(self).__name__

    def add(self, row: RunnerRow) -> None:  # noqa: B027 (optional hook)
        """A request joins the batch."""

    def remove(self, row: RunnerRow) -> None:  # noqa: B027 (optional hook)
        """A request leaves the batch (finished or aborted)."""

    @abstractmethod
    def forward(self, rows: Sequence[RunnerRow]) -> torch.Tensor:
        """``[len(rows), vocab_rows]`` float logits for each row's next token, given
        its prompt and outputs so far. The tensor may be reused by the next call."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the runner holds."""


def closing_bias(tokenizer: Tokenizer, strength: float) -> np.ndarray:
    """``[vocab_rows]`` float32: ``strength`` for tokens that close a string or a
    structure (``"``, ``'``, ``}``, ``]``, ``)``; and ``@``, which ends the local part of
    an e-mail address, a format whose first part is otherwise unbounded), for end-like
    markers (``</...>``, ``...end...``)
    and for stop tokens; ``-strength`` for tokens that are only whitespace (where a
    grammar allows free whitespace, hundreds of such tokens would otherwise win most
    draws); 0 elsewhere. A random model with this bias is still random in everything
    else, yet its outputs end."""
    bias = np.zeros(tokenizer.vocab_rows, dtype=np.float32)
    if strength == 0:
        return bias
    closers = (b'"', b"'", b"}", b"]", b")", b"@")
    for tid, b in enumerate(tokenizer.all_token_bytes):
        if not b:
            continue
        if any(c in b for c in closers):
            bias[tid] = strength
        elif not b.strip():
            bias[tid] = -strength
    for text, tid in tokenizer.special_tokens.items():
        low = text.lower()
        if text.startswith("</") or "end" in low or "/" in text:
            bias[tid] = strength
    for tid in tokenizer.stop_token_ids:
        bias[tid] = strength
    return bias
