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
    #: ``auto`` (bfloat16 on CUDA, float32 elsewhere), ``float32``, ``bfloat16``,
    #: ``float16`` or ``float64``: the weights and activations of a real model
    dtype: str = "auto"
    #: tokens one forward pass feeds at most, decoding rows first: a prompt longer than
    #: what is left is prefilled in chunks over several steps (runners that chunk)
    max_num_batched_tokens: int = 2048
    #: the runner's own options (``--runner-options``, JSON-like), read into an
    #: instance of its `ModelRunner.Options` as ``runner.own``
    own: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NoOptions:
    """The options of a runner that takes none."""


@dataclass(slots=True)
class ForwardBatch:
    """What one forward pass computes. `ModelRunner.plan` builds it on the engine
    thread at the start of a step; `ModelRunner.forward` runs it on the model thread.

    A row's *known* tokens are its prompt and outputs. Each pass feeds a row the known
    tokens its runner has not seen yet (one after a step that sampled one; several after
    tokens were appended without sampling; a chunk of the prompt while it is
    prefilled), then its drafts, if any.

    Logits come for the *ready* rows only, position by position (`logit_blocks`): first
    one row per ready row, in order, for the token after its known tokens (without
    drafts, that is all); then for each ``j = 1, 2, ...`` one row per ready row with at
    least ``j`` drafts, in order, for the token after its draft ``j - 1``. So the rows
    the engine samples at one position are consecutive, the first block exactly the
    logits of a step without drafts."""

    rows: Sequence[RunnerRow]
    #: indices into ``rows`` of the rows that get logits, ascending; None: every row. A
    #: row left out is still prefilling its prompt: its chunk runs, it gets no logits
    ready: list[int] | None = None
    #: per row of ``rows``, tokens proposed after its known tokens; None: no drafts. A
    #: row that is not ready has none. The runner keeps them in its cache until
    #: `ModelRunner.rollback` drops the rejected ones
    drafts: Sequence[Sequence[int]] | None = None
    #: per row of ``rows``, how many of its unseen known tokens this pass feeds (set by
    #: runners that prefill in chunks); None: all of them
    feed: list[int] | None = None

    @property
    def ready_rows(self) -> Sequence[RunnerRow]:
        """The rows that get logits, in the order of their logits."""
        if self.ready is None:
            return self.rows
        return [self.rows[i] for i in self.ready]

    def ready_drafts(self) -> list[Sequence[int]]:
        """The drafts of the ready rows, in order (all empty without drafts)."""
        if self.drafts is None:
            return [()] * len(self.ready_rows)
        idx = range(len(self.rows)) if self.ready is None else self.ready
        return [self.drafts[i] for i in idx]

    def logit_blocks(self) -> list[np.ndarray]:
        """Per position ``j`` (0: after the known tokens; ``j``: after draft ``j - 1``):
        the indices into `ready_rows` (ascending, int64) of the rows with logits there.
        Block ``j``'s logits follow block ``j - 1``'s in `ModelRunner.forward`'s
        result, one row each, in that order."""
        lens = np.fromiter((len(d) for d in self.ready_drafts()), np.int64)
        top = int(lens.max()) if len(lens) else 0
        return [np.arange(len(lens), dtype=np.int64)] + [
            np.flatnonzero(lens >= j) for j in range(1, top + 1)
        ]


def logit_positions(batch: ForwardBatch) -> list[tuple[RunnerRow, Sequence[int]]]:
    """Per row of `ModelRunner.forward`'s logits, in order (`ForwardBatch`): its row,
    and the draft tokens that precede that position after the row's known tokens."""
    rows = batch.ready_rows
    if batch.drafts is None:
        return [(r, ()) for r in rows]
    drafts = batch.ready_drafts()
    top = max(map(len, drafts), default=0)
    return [
        (r, d[:j]) for j in range(top + 1) for r, d in zip(rows, drafts, strict=True) if len(d) >= j
    ]


class ModelRunner(ABC):
    """Logits for the next token of each row. ``forward`` runs on the engine's model
    thread, concurrently with the grammar work of the same step.

    A step calls `plan` (engine thread), then `forward` with its result (model thread).
    Rows join with `add` and leave with `remove` between steps; `rollback` (between
    steps too) drops positions a runner with `multi_token` holds for a row."""

    #: `forward` takes drafts and feeds several new tokens per row, and `rollback`
    #: drops a row's last positions
    multi_token: ClassVar[bool] = False

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

    def plan(
        self, rows: Sequence[RunnerRow], drafts: Sequence[Sequence[int]] | None = None
    ) -> ForwardBatch:
        """What this step's forward pass computes (engine thread, cheap). Here: every
        row is ready; a runner that prefills in chunks leaves out the rows whose prompt
        this pass does not finish."""
        if drafts is not None and not self.multi_token:
            raise ValueError(f"the {self.name} model takes no drafts")
        return ForwardBatch(rows, drafts=drafts)

    @abstractmethod
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """``[n, vocab_rows]`` float logits for ``batch`` (layout: `ForwardBatch`; ``n``
        is ``len(batch.rows)`` when every row is ready and there are no drafts). The
        tensor may be reused by the next call."""

    def rollback(self, row: RunnerRow, k: int) -> None:
        """Forget the last ``k`` positions held for ``row`` (rejected drafts, say): its
        next pass feeds its known tokens from there on. Runners with `multi_token`."""
        raise TypeError(f"the {self.name} model cannot roll back positions")

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
    counts = byte_counts(tokenizer, (b"\"'}])@", b" \t\n\r\x0b\x0c"))
    closing, spaces = counts[0] > 0, counts[1] == counts[-1]
    n = len(closing)
    bias[:n][spaces & (counts[-1] > 0)] = -strength  # what ``bytes.strip`` strips, only
    bias[:n][closing] = strength
    for text, tid in tokenizer.special_tokens.items():
        low = text.lower()
        if text.startswith("</") or "end" in low or "/" in text:
            bias[tid] = strength
    for tid in tokenizer.stop_token_ids:
        bias[tid] = strength
    return bias


def byte_counts(tokenizer: Tokenizer, sets: Sequence[bytes]) -> np.ndarray:
    """``[len(sets) + 1, num_tokens]``: per token, how many of its bytes are in each of
    ``sets``, and last its length; all tokens at once."""
    tb = tokenizer.all_token_bytes
    lengths = np.fromiter(map(len, tb), np.int64, len(tb))
    flat = np.frombuffer(b"".join(tb), dtype=np.uint8)
    owner = np.repeat(np.arange(len(tb)), lengths)
    out = np.empty((len(sets) + 1, len(tb)), dtype=np.int64)
    for i, chars in enumerate(sets):
        member = np.zeros(256, dtype=bool)
        member[list(chars)] = True
        out[i] = np.bincount(owner[member[flat]], minlength=len(tb))
    out[-1] = lengths
    return out
