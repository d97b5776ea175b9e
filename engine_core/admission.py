"""What a request must satisfy before the engine holds it, and how a failure at any
stage of a request's life becomes that request's error message."""

from __future__ import annotations

import logging
import traceback
from concurrent.futures import CancelledError

from ipc import MAX_TOP_LOGPROBS, EngineCoreRequest
from reasoning import ReasoningError
from structured_output import GrammarError, GrammarSpec
from structured_output.guide import GuideError

from .config import EngineConfig

log = logging.getLogger(__name__)

#: errors that a request's own content caused: their message is for the user as is
REQUEST_ERRORS = (GrammarError, ReasoningError, GuideError, CancelledError)


def check_request(req: EngineCoreRequest, config: EngineConfig, vocab_rows: int) -> None:
    """Raise ValueError, with a message that says what to fix, for a request that
    cannot run on this engine."""
    sp = req.sampling_params
    if not req.prompt_token_ids:
        raise ValueError("the prompt is empty")
    if sp.max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if len(req.prompt_token_ids) + sp.max_tokens > config.max_model_len:
        raise ValueError(
            f"prompt ({len(req.prompt_token_ids)} tokens) plus max_tokens ({sp.max_tokens}) "
            f"exceeds the engine's max_model_len of {config.max_model_len}"
        )
    if min(req.prompt_token_ids) < 0 or max(req.prompt_token_ids) >= vocab_rows:
        raise ValueError(f"prompt token ids must lie in [0, {vocab_rows})")
    if not sp.temperature >= 0 or not 0 < sp.top_p <= 1 or not 0 <= sp.top_k < 1 << 63:
        raise ValueError("need temperature >= 0, 0 < top_p <= 1 and 0 <= top_k < 2**63")
    if sp.seed is not None and not 0 <= sp.seed < 1 << 64:
        raise ValueError("seed must lie in [0, 2**64)")
    if not 0 <= sp.min_tokens <= sp.max_tokens:
        raise ValueError("min_tokens must lie between 0 and max_tokens")
    if any(not 0 <= t < vocab_rows for t in sp.stop_token_ids):
        raise ValueError(f"stop token ids must lie in [0, {vocab_rows})")
    if sp.logprobs is not None and not 0 <= sp.logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs must lie in [0, {MAX_TOP_LOGPROBS}]")
    if req.reasoning_budget is not None and req.reasoning_budget < 0:
        raise ValueError("reasoning_budget must be >= 0")


def spec_of(req: EngineCoreRequest) -> GrammarSpec | None:
    if req.structured_output is None:
        return None
    so = req.structured_output
    return GrammarSpec.of(so.kind, so.value, so.ignore_unsupported_keywords)


def error_message(e: BaseException, stage: str, request_id: str) -> str:
    """The message that ends a request after ``e`` was raised while ``stage``. A
    request's own fault keeps its message; anything else is the engine's fault, logged
    with its traceback, and named as such (the engine goes on serving the others)."""
    if isinstance(e, REQUEST_ERRORS):
        return str(e) or "grammar compilation was cancelled"
    # The traceback as text: a log record that held the exception would hold its
    # frames, and the batch they refer to, for as long as a handler keeps the record.
    trace = "".join(traceback.format_exception(e)).rstrip()
    log.error("request %r failed while %s:\n%s", request_id, stage, trace)
    return f"internal error while {stage}: {type(e).__name__}: {e}"
