"""The request and response types of OpenAI's chat completions API, as msgspec structs.

Requests decode strictly: a field the API does not define, or a value of the wrong
type, is an error that names the field (see `validation.decode_request`). Messages are
told apart by ``role``, content parts and response formats by ``type``.

Responses carry the thinking in ``reasoning``, the field vLLM uses (older clients read
``reasoning_content``; a request may send either in its history, and both reach the
chat template). Stream chunks leave out the fields a delta does not set.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class _In(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A part of a request: unknown fields are errors."""


class _Out(msgspec.Struct, kw_only=True):
    """A part of a response."""


class _Delta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A part of a stream chunk: unset fields are left out."""


# ----- request: messages -----------------------------------------------------------


class TextPart(_In, tag_field="type", tag="text"):
    text: str


#: message content: a string, or a list of text parts (joined when rendered)
Content = str | list[TextPart]


class FunctionCallParam(_In):
    name: str
    #: the arguments as JSON text, as the API sends them back
    arguments: str


class ToolCallParam(_In):
    id: str
    function: FunctionCallParam
    type: Literal["function"] = "function"


class SystemMessage(_In, tag_field="role", tag="system"):
    content: Content
    name: str | None = None


class DeveloperMessage(_In, tag_field="role", tag="developer"):
    content: Content
    name: str | None = None


class UserMessage(_In, tag_field="role", tag="user"):
    content: Content
    name: str | None = None


class AssistantMessage(_In, tag_field="role", tag="assistant"):
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    #: earlier thinking (vLLM's field)
    reasoning: str | None = None
    #: earlier thinking, the older name (read as ``reasoning``)
    reasoning_content: str | None = None
    refusal: str | None = None


class ToolMessage(_In, tag_field="role", tag="tool"):
    content: Content
    tool_call_id: str
    name: str | None = None


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


# ----- request: tools, tool choice, response formats ---------------------------------


class FunctionDefinition(_In):
    name: str
    description: str | None = None
    #: JSON schema of the arguments (an object schema); None: any object
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(_In):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_In):
    name: str


class NamedToolChoice(_In):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaParam(_In):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = msgspec.field(default=None, name="schema")
    strict: bool | None = None


class ResponseFormatText(_In, tag_field="type", tag="text"):
    pass


class ResponseFormatJsonObject(_In, tag_field="type", tag="json_object"):
    pass


class ResponseFormatJsonSchema(_In, tag_field="type", tag="json_schema"):
    json_schema: JsonSchemaParam


class StructureParam(_In):
    """One structure of the legacy structural-tag form (vLLM's ``structures``)."""

    begin: str
    end: str
    schema_: dict[str, Any] | None = msgspec.field(default=None, name="schema")


class ResponseFormatStructuralTag(_In, tag_field="type", tag="structural_tag"):
    """xgrammar's structural tag: ``format`` (the current form), or ``structures`` and
    ``triggers`` (the legacy form of vLLM)."""

    format: dict[str, Any] | None = None
    structures: list[StructureParam] | None = None
    triggers: list[str] | None = None


ResponseFormat = (
    ResponseFormatText
    | ResponseFormatJsonObject
    | ResponseFormatJsonSchema
    | ResponseFormatStructuralTag
)


class StructuredOutputsParam(_In):
    """vLLM's extra constraint field: exactly one of these is set."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None


class StreamOptions(_In):
    #: a last chunk with the usage and no choices
    include_usage: bool = False
    #: the usage so far on every chunk (vLLM's extension)
    continuous_usage_stats: bool = False


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]


class _Generation(_In):
    """The sampling, stopping and bookkeeping fields both APIs take, the same way."""

    min_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    #: 0 or -1: off
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    echo: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    #: 1.0 only (no penalty)
    repetition_penalty: float = 1.0
    #: 0 only
    min_p: float = 0.0
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParam | None = None
    user: str | None = None
    request_id: str | None = None
    #: OpenAI's bookkeeping fields, accepted and not used
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None


class ChatCompletionRequest(_Generation, kw_only=True):
    messages: list[Message]
    model: str | None = None
    tools: list[ToolParam] | None = None
    #: None: "auto" when there are tools, else "none"
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    #: JSON schemas (response_format, structured_outputs, tool parameters): leave out
    #: the keywords the grammar cannot enforce instead of refusing the request; the
    #: response states which were left out
    ignore_unsupported_keywords: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    #: False: the thinking is left out of the message and the stream (it still happens)
    include_reasoning: bool = True
    #: "none" switches thinking off where the family has an ``enable_thinking`` switch
    reasoning_effort: ReasoningEffort | None = None
    #: most thinking tokens; then the engine writes the end-of-thinking marker itself
    thinking_token_budget: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    #: each answer token's log-probability (and ``top_logprobs`` alternatives); the
    #: thinking's tokens are left out with the thinking (``include_reasoning: false``)
    logprobs: bool = False
    top_logprobs: int | None = None
    #: True only: the prompt ends where the assistant's message begins
    add_generation_prompt: bool = True
    continue_final_message: bool = False


# ----- responses -------------------------------------------------------------------


class FunctionCall(_Out):
    name: str
    arguments: str


class ToolCall(_Out):
    id: str
    function: FunctionCall
    type: str = "function"


class ChatMessage(_Out):
    role: str = "assistant"
    content: str | None = None
    #: the thinking (vLLM's field name)
    reasoning: str | None = None
    tool_calls: list[ToolCall] = []


class CompletionTokensDetails(_Out):
    reasoning_tokens: int = 0


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None


class TopLogprob(_Out):
    token: str
    logprob: float
    #: the token's UTF-8 bytes (a token may hold part of a character)
    bytes: list[int]


class TokenLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob] = []


class ChoiceLogprobs(_Out):
    content: list[TokenLogprob] | None = None


class Choice(_Out):
    index: int
    message: ChatMessage
    #: stop | length | tool_calls | abort
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None
    #: the stop string or stop token id that ended the answer (vLLM's field)
    stop_reason: str | int | None = None


class ChatCompletion(_Out, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    #: JSON-schema keywords the constraint left out (``ignore_unsupported_keywords``),
    #: each with where it was; absent when none
    ignored_keywords: list[str] | None = None


class DeltaFunctionCall(_Delta):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Delta):
    """A call's first delta has ``index``, ``id``, ``type`` and ``function.name``
    (and ``function.arguments``, maybe empty); later ones ``index`` and more
    ``function.arguments`` text."""

    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(_Delta):
    role: str | None = None
    content: str | None = None
    #: more thinking (vLLM's field name)
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] = []


class ChunkChoice(_Out):
    index: int
    delta: DeltaMessage
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None
    stop_reason: str | int | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChunkChoice]
    #: on the last chunk when ``stream_options.include_usage`` asks for it; on every
    #: chunk with ``continuous_usage_stats``
    usage: Usage | None = None
    #: on the first chunk: as `ChatCompletion.ignored_keywords`
    ignored_keywords: list[str] | None = None


class ErrorInfo(_Out):
    message: str
    type: str
    code: int
    param: str | None = None


class ErrorResponse(_Out):
    """What the API answers instead of a completion (``code`` is the HTTP status)."""

    error: ErrorInfo


# ----- the completions API (a raw prompt) -----------------------------------------


class CompletionRequest(_Generation, kw_only=True):
    """``POST /v1/completions``: one prompt (text, or token ids) continued as it is; no
    chat template, no reasoning split, no tool calls."""

    prompt: str | list[int]
    model: str | None = None
    #: OpenAI's default
    max_tokens: int | None = 16
    best_of: int | None = None
    #: the log-probabilities of each token and of this many alternatives
    logprobs: int | None = None
    suffix: str | None = None


class CompletionLogprobs(_Out):
    tokens: list[str]
    token_logprobs: list[float]
    #: per token, its alternatives by text (None where none were asked)
    top_logprobs: list[dict[str, float] | None]
    #: where each token begins in the completion's text (in characters)
    text_offset: list[int]


class CompletionChoice(_Out):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None
    stop_reason: str | int | None = None


class Completion(_Out, kw_only=True):
    """A whole completion (``object: "text_completion"``), or one streamed piece of
    it (usage on the last piece when ``stream_options.include_usage`` asks)."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# ----- models --------------------------------------------------------------------


class ModelCard(_Out, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "thinkgate"


class ModelList(_Out, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


def to_json(obj: msgspec.Struct) -> bytes:
    """The JSON body of a response, chunk or error."""
    return msgspec.json.encode(obj)


def to_sse(obj: msgspec.Struct | None) -> bytes:
    """One server-sent event: ``data: JSON``, or ``data: [DONE]`` for None."""
    if obj is None:
        return b"data: [DONE]\n\n"
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"
