"""The model-runner interface: logits for the batch's rows, on the runner's device."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch

from ..options import read_options

if TYPE_CHECKING:
    from tokenization import Tokenizer


class RunnerRow(Protocol):
    """What a runner may read of a running request."""

    request_id: str
    prompt_token_ids: list[int]
    output_ids: list[int]
    #: a per-request integer the runner may use to vary its logits reproducibly
    model_seed: int


@dataclass(frozen=True)
class RunnerOptions:
    """What the engine tells every runner."""

    device: str = "cpu"
    seed: int = 0
    max_num_seqs: int = 256
    #: the runner's own options (``--runner-options``, JSON-like), read into an
    #: instance of its `ModelRunner.Options` as ``runner.own``
    own: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NoOptions:
    """The options of a runner that takes none."""


class ModelRunner(ABC):
    """Logits for the next token of each row. ``forward`` runs on the engine's model
    thread, concurrently with the grammar work of the same step."""

    #: the dataclass of this runner's own options (fields made with
    #: `engine_core.options.option`); an unknown or mistyped one stops the start-up
    Options: ClassVar[type] = NoOptions

    def __init__(self, tokenizer: Tokenizer, options: RunnerOptions) -> None:
        self.tokenizer = tokenizer
        self.options = options
        self.own = read_options(self.Options, options.own, f"model runner {self.name}")
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
