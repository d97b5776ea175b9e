"""Request checks, as OpenAI's chat completions API makes them.

`decode_request` turns a body into a `ChatCompletionRequest`; `check_request` applies
the API's rules and returns the request's `ToolPlan`. Every failure is a
`RequestError`: a message a user can act on, and the offending parameter, ready to
become an HTTP 400 (`RequestError.to_response`).

The tool rules:

- tools without ``tool_choice`` mean "auto"; no tools, "none";
- "required", or a named function, without tools is an error;
- a named function must be one of the tools;
- "none" means no calls: no tool constraint, and the output is not read for calls;
- "auto" needs ``--enable-auto-tool-choice`` and ``--tool-call-parser`` (vLLM's rule);
- a forced call ("required" or named) cannot be combined with a ``response_format``
  or ``structured_outputs`` constraint: both cannot hold at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec

from ipc import MAX_TOP_LOGPROBS

from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorInfo,
    ErrorResponse,
    NamedToolChoice,
    ResponseFormatText,
)
from .tool_formats import FunctionTool

ToolMode = Literal["none", "auto", "required", "named"]
T = TypeVar("T", ChatCompletionRequest, CompletionRequest)

#: OpenAI's rule for function names
_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: template variables a request's chat_template_kwargs may not replace
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
)


class RequestError(ValueError):
    """A request the API refuses: ``message`` says what is wrong, ``param`` names the
    parameter (a path such as ``messages[2].tool_call_id``) when one is to blame."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        *,
        status_code: int = 400,
        type: str = "BadRequestError",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status_code = status_code
        self.type = type

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(
                message=self.message, type=self.type, param=self.param, code=self.status_code
            )
        )


@dataclass(frozen=True, slots=True)
class ToolSupport:
    """What the server offers for tool calls (from its flags)."""

    #: ``tool_choice: "auto"`` is allowed
    auto: bool
    #: "required" and named calls can be forced (a format, or the JSON-schema way)
    forced: bool


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """How a request's tools are used."""

    tools: tuple[FunctionTool, ...]
    mode: ToolMode
    #: the function a named tool choice forces
    named: str | None
    parallel: bool

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")

    @property
    def reads_calls(self) -> bool:
        """Whether the output is read for tool calls."""
        return self.mode != "none" and bool(self.tools)


_DECODERS = {
    ChatCompletionRequest: msgspec.json.Decoder(ChatCompletionRequest),
    CompletionRequest: msgspec.json.Decoder(CompletionRequest),
}
_AT_RE = re.compile(r" - at `\$\.?(.*?)`$")
_FIELD_RE = re.compile(r"field `([^`]*)`")


def decode_request(
    body: bytes | str | Mapping[str, Any] | ChatCompletionRequest,
) -> ChatCompletionRequest:
    """A request from its JSON body (or an already parsed mapping). Unknown fields and
    wrong types raise `RequestError` naming the field."""
    return decode_body(body, ChatCompletionRequest)


def decode_body(body: bytes | str | Mapping[str, Any] | T, kind: type[T]) -> T:
    """`decode_request` for either API's request type."""
    if isinstance(body, kind):
        return body
    try:
        if isinstance(body, bytes | str):
            return _DECODERS[kind].decode(body)
        return msgspec.convert(body, kind, strict=True)
    except msgspec.ValidationError as e:
        raise _from_validation_error(str(e)) from None
    except msgspec.DecodeError as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from None


def _from_validation_error(text: str) -> RequestError:
    """msgspec's message, with its ``$.path`` turned into the parameter's name."""
    m = _AT_RE.search(text)
    path = m.group(1) if m else ""
    what = text[: m.start()] if m else text
    f = _FIELD_RE.search(what)
    if f is not None and ("unknown field" in what or "missing required field" in what):
        path = f"{path}.{f.group(1)}" if path else f.group(1)
        what = what.replace("Object contains unknown field", "unknown field").replace(
            "Object missing required field", "missing required field"
        )
    where = f" (at '{path}')" if path else ""
    return RequestError(f"invalid request: {what}{where}", path or None)


def check_request(req: ChatCompletionRequest, support: ToolSupport) -> ToolPlan:
    """Apply the API's rules to ``req``; return its tool plan or raise `RequestError`."""
    _check_messages(req)
    _check_sampling(req)
    plan = _tool_plan(req, support)
    _check_constraints(req, plan)
    if req.chat_template_kwargs:
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(req.chat_template_kwargs))
        if reserved:
            raise RequestError(
                f"chat_template_kwargs may not set {', '.join(reserved)}: the request's own "
                "fields fill them",
                "chat_template_kwargs",
            )
    return plan


def _check_messages(req: ChatCompletionRequest) -> None:
    if not req.messages:
        raise RequestError("messages must hold at least one message", "messages")


def _check_sampling(req: ChatCompletionRequest) -> None:
    check_sampling(req)
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        if not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(
                f"top_logprobs must lie in [0, {MAX_TOP_LOGPROBS}], got {req.top_logprobs}",
                "top_logprobs",
            )
    if not req.add_generation_prompt:
        raise RequestError("add_generation_prompt: false is not supported", "add_generation_prompt")
    if req.continue_final_message:
        raise RequestError("continue_final_message is not supported", "continue_final_message")
    if req.echo:
        raise RequestError("echo is not supported", "echo")
    if req.max_completion_tokens is not None and req.max_completion_tokens < 1:
        raise RequestError(
            f"max_completion_tokens must be at least 1, got {req.max_completion_tokens}",
            "max_completion_tokens",
        )
    limit = req.max_completion_tokens or req.max_tokens
    if limit is not None and req.min_tokens > limit:
        raise RequestError(
            f"min_tokens ({req.min_tokens}) must not exceed the maximum ({limit})", "min_tokens"
        )
    if req.thinking_token_budget is not None and req.thinking_token_budget < 0:
        raise RequestError(
            f"thinking_token_budget must be >= 0, got {req.thinking_token_budget}",
            "thinking_token_budget",
        )


def check_sampling(req: ChatCompletionRequest | CompletionRequest) -> None:
    """The sampling fields both APIs share."""
    if req.n != 1:
        raise RequestError("only n=1 is supported", "n")
    for name in ("frequency_penalty", "presence_penalty", "min_p"):
        if getattr(req, name) != 0:
            raise RequestError(f"{name} is not supported (only 0)", name)
    if req.repetition_penalty != 1:
        raise RequestError("repetition_penalty is not supported (only 1)", "repetition_penalty")
    if req.logit_bias:
        raise RequestError("logit_bias is not supported", "logit_bias")
    if req.max_tokens is not None and req.max_tokens < 1:
        raise RequestError(f"max_tokens must be at least 1, got {req.max_tokens}", "max_tokens")
    if req.min_tokens < 0:
        raise RequestError(f"min_tokens must be >= 0, got {req.min_tokens}", "min_tokens")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise RequestError(f"temperature must lie in [0, 2], got {req.temperature}", "temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise RequestError(f"top_p must lie in (0, 1], got {req.top_p}", "top_p")
    if req.top_k is not None and req.top_k < -1:
        raise RequestError(f"top_k must be -1 (off), 0 (off) or positive, got {req.top_k}", "top_k")
    if req.seed is not None and not 0 <= req.seed < 1 << 64:
        raise RequestError(f"seed must lie in [0, 2**64), got {req.seed}", "seed")
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if any(not s for s in stops):
        raise RequestError("stop strings must not be empty", "stop")
    if req.stop_token_ids and any(t < 0 for t in req.stop_token_ids):
        raise RequestError("stop_token_ids must be non-negative token ids", "stop_token_ids")
    if req.stream_options is not None and not req.stream:
        raise RequestError("stream_options is only allowed when stream is true", "stream_options")


def _tool_plan(req: ChatCompletionRequest, support: ToolSupport) -> ToolPlan:
    tools: list[FunctionTool] = []
    seen: set[str] = set()
    for i, t in enumerate(req.tools or ()):
        f = t.function
        if not _NAME_RE.match(f.name):
            raise RequestError(
                f"invalid function name {f.name!r}: it must match '^[a-zA-Z0-9_-]{{1,64}}$'",
                f"tools[{i}].function.name",
            )
        if f.name in seen:
            raise RequestError(f"two tools are named {f.name!r}", f"tools[{i}].function.name")
        seen.add(f.name)
        tools.append(FunctionTool(f.name, f.parameters, f.description, f.strict))

    choice = req.tool_choice
    named: str | None = None
    mode: ToolMode
    if choice is None:
        mode = "auto" if tools else "none"
    elif isinstance(choice, NamedToolChoice):
        mode, named = "named", choice.function.name
    else:
        mode = choice
    if mode in ("required", "named") and not tools:
        what = '"required"' if mode == "required" else "a named function"
        raise RequestError(
            f"tool_choice {what} needs tools, and the request has none", "tool_choice"
        )
    if named is not None and named not in seen:
        known = ", ".join(repr(t.name) for t in tools)
        raise RequestError(
            f"tool_choice names the function {named!r}, which is not among the tools ({known})",
            "tool_choice",
        )
    if mode == "auto" and tools and not support.auto:
        raise RequestError(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
            'set on the server (send tool_choice "none", "required" or a named function, '
            "or no tools)",
            "tool_choice",
        )
    if mode in ("required", "named") and not support.forced:
        what = '"required"' if mode == "required" else "a named function"
        raise RequestError(
            f"tool_choice {what} requires --tool-call-parser to be set on the server",
            "tool_choice",
        )
    return ToolPlan(tuple(tools), mode, named, req.parallel_tool_calls)


def _check_constraints(req: ChatCompletionRequest, plan: ToolPlan) -> None:
    check_output_constraint(req)
    rf = req.response_format
    has_rf = rf is not None and not isinstance(rf, ResponseFormatText)
    if plan.forced and (has_rf or req.structured_outputs is not None):
        param = "response_format" if has_rf else "structured_outputs"
        what = '"required"' if plan.mode == "required" else "a named function"
        raise RequestError(
            f"{param} cannot be combined with a forced tool call (tool_choice {what}): "
            "the answer cannot be both",
            param,
        )


def check_output_constraint(req: ChatCompletionRequest | CompletionRequest) -> None:
    """``response_format`` and ``structured_outputs``, as both APIs take them."""
    rf = req.response_format
    has_rf = rf is not None and not isinstance(rf, ResponseFormatText)
    if has_rf and req.structured_outputs is not None:
        raise RequestError(
            "send either response_format or structured_outputs, not both", "structured_outputs"
        )
    so = req.structured_outputs
    if so is not None:
        chosen = [
            name
            for name in ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
            if getattr(so, name) not in (None, False)
        ]
        if len(chosen) != 1:
            raise RequestError(
                "structured_outputs must set exactly one of json, regex, choice, grammar, "
                f"json_object, structural_tag (got {', '.join(chosen) or 'none'})",
                "structured_outputs",
            )
        if so.choice is not None and not so.choice:
            raise RequestError("structured_outputs.choice must not be empty", "structured_outputs")
