"""A request as the engine holds it."""

from __future__ import annotations

from concurrent.futures import Future
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from ipc import EngineCoreRequest, FinishReason

from .logprobs import LogprobBuffer

if TYPE_CHECKING:
    import xgrammar as xgr

    from structured_output import GrammarSpec
    from structured_output.guide import RequestGuide

    from .drafts import NgramIndex


class Status(IntEnum):
    WAITING = 0  # queued; its grammar may still be compiling
    RUNNING = 1
    FINISHED = 2


class EngineRequest:
    __slots__ = (
        "client",
        "request_id",
        "prompt_token_ids",
        "output_ids",
        "num_sent",
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "min_tokens",
        "stop_ids",
        "grammar_stop_ids",
        "generator",
        "model_seed",
        "spec",
        "grammar",
        "guide",
        "reasoning_ended",
        "reasoning_kwargs",
        "reasoning_budget",
        "status",
        "finish_reason",
        "stop_reason",
        "error",
        "pending",
        "arrival_time",
        "logprobs",
        "draft_index",
    )

    def __init__(
        self,
        client: bytes,
        req: EngineCoreRequest,
        *,
        model_stop_ids: tuple[int, ...],
        model_seed: int,
        spec: GrammarSpec | None,
    ) -> None:
        sp = req.sampling_params
        self.client = client
        self.request_id = req.request_id
        self.prompt_token_ids = req.prompt_token_ids
        self.output_ids: list[int] = []
        self.num_sent = 0
        self.temperature = sp.temperature
        self.top_p = sp.top_p
        self.top_k = sp.top_k
        self.max_tokens = sp.max_tokens
        self.min_tokens = sp.min_tokens
        own = tuple(sp.stop_token_ids)
        self.stop_ids = frozenset(own if sp.ignore_eos else model_stop_ids + own)
        #: a grammar always ends on one of these (ignore_eos does not apply to it)
        self.grammar_stop_ids = tuple(dict.fromkeys(model_stop_ids + own))
        self.generator = np.random.default_rng(sp.seed) if sp.seed is not None else None
        self.model_seed = sp.seed if sp.seed is not None else model_seed
        self.spec = spec
        self.grammar: Future[xgr.CompiledGrammar] | None = None
        self.guide: RequestGuide | None = None
        self.reasoning_ended = req.reasoning_ended
        self.reasoning_kwargs: dict[str, Any] | None = req.reasoning_parser_kwargs
        self.reasoning_budget = req.reasoning_budget
        self.status = Status.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | None = None
        self.error: str | None = None
        #: the token sampled last step, still to be fed to the guide
        self.pending: int | None = None
        self.arrival_time = req.arrival_time
        #: the log-probabilities still to send, when the request asks for them
        self.logprobs = LogprobBuffer(sp.logprobs) if sp.logprobs is not None else None
        #: the draft source's index of this request's tokens (`drafts.NgramIndex`)
        self.draft_index: NgramIndex | None = None

    @property
    def key(self) -> tuple[bytes, str]:
        return (self.client, self.request_id)

    def finish(
        self, reason: FinishReason, *, error: str | None = None, stop: int | None = None
    ) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.error = error
        self.stop_reason = stop
