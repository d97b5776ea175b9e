"""Wire types between a front end and the engine core.

Every frame is ``[message type (one byte), msgpack payload]``; each payload is one
of the structs below, encoded with msgspec. Nothing on the wire is pickled.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Any

import msgspec

#: bumped whenever a struct below changes incompatibly (2: finish reasons are strings)
PROTOCOL_VERSION = 2

#: `ErrorNotice.message` for a frame from a client the engine does not know: one that
#: never said HELLO, or one it dropped (silent past its timeout, not reading, or over
#: the message limit)
NOT_GREETED = "send HELLO first"
#: start of `ErrorNotice.message` when the engine refuses a SHUTDOWN
SHUTDOWN_REFUSED = "SHUTDOWN refused"

#: how `EngineCoreOutput.error` begins when the engine refused a request because it
#: holds as many as it may: the request was never run, and may be sent again later
ENGINE_FULL = "the engine is full"


class MsgType(IntEnum):
    # front end -> engine
    HELLO = 1
    REQUEST = 2
    ABORT = 3
    HEALTH = 4
    HEARTBEAT = 5
    GOODBYE = 6
    SHUTDOWN = 7
    # engine -> front end
    HANDSHAKE = 17
    OUTPUTS = 18
    HEALTH_REPLY = 19
    ERROR = 20


class FinishReason(StrEnum):
    """Why a request ended. Strings, so that every reason is truthy: ``if
    out.finish_reason:`` means "it ended"."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class _Wire(
    msgspec.Struct, array_like=True, omit_defaults=True, gc=False, forbid_unknown_fields=False
):
    pass


class SamplingParams(_Wire):
    temperature: float = 1.0
    top_p: float = 1.0
    #: 0 turns top-k off
    top_k: int = 0
    #: same seed, same tokens; None draws from the engine's generator
    seed: int | None = None
    max_tokens: int = 256
    #: no stop token is allowed before this many tokens
    min_tokens: int = 0
    #: stop tokens in addition to the model's own
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    #: None: no log-probabilities; N: each new token's, and the N likeliest (at most
    #: `MAX_TOP_LOGPROBS`)
    logprobs: int | None = None


class StructuredOutputSpec(_Wire):
    #: json_schema | json_object | regex | choice | grammar | structural_tag
    kind: str
    #: schema / choices / structural tag as JSON text; regex; EBNF
    value: str = ""
    #: JSON schemas: leave out keywords the grammar cannot enforce (instead of
    #: refusing the request); the front end reports which
    ignore_unsupported_keywords: bool = False


class EngineCoreRequest(_Wire):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    structured_output: StructuredOutputSpec | None = None
    #: True: the prompt closed (or skipped) the thinking; False: it may still come;
    #: None: the front end set no reasoning parser
    reasoning_ended: bool | None = None
    #: the chat-template kwargs, so the engine's reasoning parser reads the output as
    #: the front end's does
    reasoning_parser_kwargs: dict[str, Any] | None = None
    #: most thinking tokens before the engine forces the end-of-thinking marker
    reasoning_budget: int | None = None
    arrival_time: float = 0.0


class AbortRequests(_Wire):
    request_ids: list[str]


#: the most alternatives per token `SamplingParams.logprobs` may ask for
MAX_TOP_LOGPROBS = 20


class TokenLogprobs(_Wire):
    """Log-probabilities of an output's new tokens, in order, under the model's own
    distribution (its logits before the grammar's mask, temperature, top-k and top-p)."""

    #: of each new token
    sampled: list[float]
    #: per new token, the ids of the likeliest tokens, best first (empty lists when
    #: ``logprobs`` is 0)
    top_ids: list[list[int]] = []
    top_logprobs: list[list[float]] = []


class EngineCoreOutput(_Wire):
    request_id: str
    new_token_ids: list[int] = []
    finish_reason: FinishReason | None = None
    #: the stop token that ended the request, if one did
    stop_reason: int | None = None
    error: str | None = None
    num_reasoning_tokens: int = 0
    #: of ``new_token_ids``, when the request asked for them
    logprobs: TokenLogprobs | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineCoreOutputs(_Wire):
    outputs: list[EngineCoreOutput]
    timestamp: float = 0.0


class Hello(_Wire):
    protocol_version: int
    client_id: str


class Handshake(_Wire):
    protocol_version: int
    model: str
    tokenizer: str
    vocab_rows: int
    reasoning_parser: str | None
    max_num_seqs: int
    engine_pid: int
    extra_special_tokens: list[str] = []
    device: str = "cpu"


class HealthRequest(_Wire):
    nonce: int


class HealthReply(_Wire):
    nonce: int
    num_running: int
    num_waiting: int
    num_steps: int
    # What the engine still holds, so a test or an operator can see that nothing is
    # left behind once the work is done. Trailing fields with defaults: a peer that
    # knows only the four above reads these replies, and these read its replies.
    #: requests the engine tracks (waiting or running, not yet ended)
    num_requests: int = 0
    #: per-request guides (reasoning tracker and grammar matcher) still alive
    num_guides: int = 0
    #: grammar compiles queued or running
    num_compiling: int = 0
    num_cached_grammars: int = 0
    #: clients greeted and not dropped since (gone, silent past the client timeout, or
    #: not reading)
    num_clients: int = 0
    # Running totals since the engine started, for metrics.
    #: grammars compiled, the seconds their compiles took, and submissions answered
    #: from the compiled-grammar cache
    num_compiled_grammars: int = 0
    compile_seconds: float = 0.0
    num_grammar_cache_hits: int = 0
    #: steps that filled bitmask rows, the rows filled, and the seconds the fills took
    num_fill_steps: int = 0
    num_fill_rows: int = 0
    fill_seconds: float = 0.0


class Heartbeat(_Wire):
    timestamp: float = 0.0


class Goodbye(_Wire):
    reason: str = ""


class Shutdown(_Wire):
    reason: str = ""
    #: the engine's shutdown token (``--shutdown-token-file``); a spawning client gives
    #: its engine one. Without the right token the engine refuses to stop.
    token: str = ""


class ErrorNotice(_Wire):
    """The engine could not use a frame. ``request_id`` names the request it failed,
    when the frame got far enough to tell."""

    message: str
    request_id: str | None = None


MESSAGE_TYPES: dict[MsgType, type[_Wire]] = {
    MsgType.HELLO: Hello,
    MsgType.REQUEST: EngineCoreRequest,
    MsgType.ABORT: AbortRequests,
    MsgType.HEALTH: HealthRequest,
    MsgType.HEARTBEAT: Heartbeat,
    MsgType.GOODBYE: Goodbye,
    MsgType.SHUTDOWN: Shutdown,
    MsgType.HANDSHAKE: Handshake,
    MsgType.OUTPUTS: EngineCoreOutputs,
    MsgType.HEALTH_REPLY: HealthReply,
    MsgType.ERROR: ErrorNotice,
}
TYPE_OF: dict[type[_Wire], MsgType] = {cls: t for t, cls in MESSAGE_TYPES.items()}
