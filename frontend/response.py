"""From the engine's outputs to an OpenAI message, or to a stream of chunks.

`OutputProcessor` is the one machine both forms use. Per engine output it:

1. strips the final stop token (the one that ended the request) from the text;
2. with stop strings, holds back the tokens that may begin one, and at the stop cuts
   the text right before it (inside a token if need be);
3. splits the token ids into reasoning and content with `reasoning.ReasoningStream`
   over the request's tracker (the same machine the engine drives, so both see the
   thinking end at the same token, and both read the family's layout after its end
   marker, such as Qwen3's blank line after ``</think>``, alike: it is in neither
   side); the thinking itself is left as the model wrote it;
4. reads the content text for tool calls with the format's stream parser;
5. drops calls after the first when ``parallel_tool_calls`` is false (all calls when
   the request reads none: a family that frames its answers, such as Harmony, is
   parsed for its content even then), gives each call an id if its format did not,
   and leaves the reasoning out when ``include_reasoning`` is false.

It returns `OutputDelta` pieces; a whole response is their concatenation
(`CompletionAccumulator`), a stream sends each one as a chunk (`ChunkMaker`), so the two
agree by construction. The work per output is proportional to its new tokens (plus
the longest stop string).

``finish_reason``: "tool_calls" when the message has calls and the engine stopped
normally (a stop token, a stop string, the grammar's end), "length" when max_tokens
cut it (the calls then may be partial: what parsed is still reported), "stop"
otherwise, "abort" for an aborted request; an engine error becomes an error response.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine_core.client import RequestOutput
from ipc import FinishReason
from reasoning import ReasoningStream, ReasoningTracker

from .protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    Choice,
    ChunkChoice,
    CompletionTokensDetails,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ErrorInfo,
    ErrorResponse,
    FunctionCall,
    ToolCall,
    Usage,
)
from .tool_formats import ToolCallDelta, ToolCallParser, default_call_id


@dataclass(slots=True)
class OutputDelta:
    """What one engine output adds to the message."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class StopStringGate:
    """Holds back the last tokens while they may begin a stop string.

    Released tokens never hold any byte of a stop string: a token is released once the
    tokens after it hold at least ``len(longest stop) - 1`` bytes. Bytes, not
    characters: a UTF-8 string occurs in UTF-8 bytes exactly where it occurs in text.
    """

    __slots__ = ("_tb", "_keep", "_ids", "_sizes", "_held")

    def __init__(self, stops: Sequence[str], token_bytes: Callable[[int], bytes]) -> None:
        self._tb = token_bytes
        self._keep = max(len(s.encode("utf-8")) for s in stops) - 1
        self._ids: deque[int] = deque()
        self._sizes: deque[int] = deque()
        self._held = 0

    def push(self, ids: Sequence[int]) -> list[int]:
        """Add new ids; return those now known to precede any stop string."""
        for t in ids:
            n = len(self._tb(t))
            self._ids.append(t)
            self._sizes.append(n)
            self._held += n
        out: list[int] = []
        while self._ids and self._held - self._sizes[0] >= self._keep:
            self._held -= self._sizes.popleft()
            out.append(self._ids.popleft())
        return out

    def flush(self) -> list[int]:
        """The output ended without a stop string: release everything."""
        out = list(self._ids)
        self._ids.clear()
        self._sizes.clear()
        self._held = 0
        return out

    def cut(self, ids: Sequence[int], stop: str) -> tuple[list[int], bytes]:
        """``stop`` completed within ``ids`` (the last new ids): return the held and new
        ids wholly before it, and the bytes of the token it begins inside, up to it."""
        self._ids.extend(ids)
        held = list(self._ids)
        self.flush()
        chunks = [self._tb(t) for t in held]
        pos = b"".join(chunks).find(stop.encode("utf-8"))
        if pos < 0:  # the stop string spans bytes released earlier: cut nothing more
            return held, b""
        out: list[int] = []
        start = 0
        for t, b in zip(held, chunks, strict=True):
            if start + len(b) <= pos:
                out.append(t)
                start += len(b)
                continue
            return out, b[: pos - start]
        return out, b""


class OutputProcessor:
    """One request's outputs, in order, to `OutputDelta` pieces (see the module
    docstring). Read `finish_reason`, `error` and `usage` after the last output."""

    def __init__(
        self,
        *,
        token_bytes: Callable[[int], bytes],
        prompt_tokens: int,
        tracker: ReasoningTracker | None,
        tool_parser: ToolCallParser | None,
        keep_calls: bool = True,
        parallel_tool_calls: bool = True,
        include_reasoning: bool = True,
        stop: Sequence[str] = (),
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.include_reasoning = include_reasoning
        self.keep_calls = keep_calls
        self.parallel_tool_calls = parallel_tool_calls
        self._split = ReasoningStream(tracker, token_bytes=token_bytes)
        self._tools = tool_parser
        self._gate = StopStringGate(stop, token_bytes) if stop else None
        self._call_ids: dict[int, str] = {}
        self.engine_finish: FinishReason | None = None
        self.error: str | None = None

    @property
    def finished(self) -> bool:
        return self.engine_finish is not None

    @property
    def has_calls(self) -> bool:
        return bool(self._call_ids)

    def push(self, out: RequestOutput) -> OutputDelta:
        ids = list(out.new_token_ids)
        self.completion_tokens += len(ids)
        if out.finished:
            self.engine_finish = out.finish_reason
            if out.finish_reason == FinishReason.ERROR:
                self.error = out.error or "the engine failed the request"
            if (
                out.finish_reason == FinishReason.STOP
                and isinstance(out.stop_reason, int)
                and ids
                and ids[-1] == out.stop_reason
            ):
                ids.pop()
        partial = b""
        if self._gate is None:
            released = ids
        elif out.finished and isinstance(out.stop_reason, str):
            released, partial = self._gate.cut(ids, out.stop_reason)
        else:
            released = self._gate.push(ids)
            if out.finished:
                released += self._gate.flush()
        r, c = self._split.push(released) if released else ("", "")
        if out.finished:
            r2, c2 = self._split.finish(partial)
            r, c = r + r2, c + c2
        delta = OutputDelta(reasoning=r if self.include_reasoning else "")
        if self._tools is None:
            delta.content = c
            return delta
        parsed = [self._tools.push(c)] if c else []
        if out.finished:
            parsed.append(self._tools.finish())
        for d in parsed:
            delta.content += d.content
            for call in d.tool_calls:
                if not self.keep_calls or (call.index > 0 and not self.parallel_tool_calls):
                    continue
                if call.index not in self._call_ids:
                    self._call_ids[call.index] = call.id = call.id or default_call_id()
                delta.tool_calls.append(call)
        return delta

    @property
    def finish_reason(self) -> str | None:
        """The API's finish reason (None before the end, or for an engine error)."""
        reason = self.engine_finish
        if reason == FinishReason.STOP:
            return "tool_calls" if self.has_calls else "stop"
        if reason == FinishReason.LENGTH:
            return "length"
        if reason == FinishReason.ABORT:
            return "abort"
        return None

    @property
    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
            completion_tokens_details=CompletionTokensDetails(
                reasoning_tokens=self._split.num_reasoning_tokens
            ),
        )

    def error_response(self, *, produced_tokens: bool) -> ErrorResponse:
        """The engine's error as an API error: 400 when the request was refused before
        any token (a bad grammar, a prompt too long), 500 when it failed midway."""
        code = 500 if produced_tokens else 400
        return ErrorResponse(
            error=ErrorInfo(
                message=self.error or "the engine failed the request",
                type="InternalServerError" if produced_tokens else "BadRequestError",
                code=code,
            )
        )


class CompletionAccumulator:
    """Folds `OutputDelta` pieces into the whole message."""

    def __init__(self) -> None:
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]

    def add(self, delta: OutputDelta) -> None:
        if delta.reasoning:
            self._reasoning.append(delta.reasoning)
        if delta.content:
            self._content.append(delta.content)
        for c in delta.tool_calls:
            parts = self._calls.get(c.index)
            if parts is None:
                parts = self._calls[c.index] = [c.id or "", c.name or ""]
            parts.append(c.arguments)

    def message(self) -> ChatMessage:
        calls = [
            ToolCall(id=p[0], function=FunctionCall(name=p[1], arguments="".join(p[2:])))
            for _, p in sorted(self._calls.items())
        ]
        return ChatMessage(
            content="".join(self._content) or None,
            reasoning="".join(self._reasoning) or None,
            tool_calls=calls,
        )


def completion(
    request_id: str,
    created: int,
    model: str,
    message: ChatMessage,
    finish_reason: str | None,
    usage: Usage,
) -> ChatCompletion:
    return ChatCompletion(
        id=request_id,
        object="chat.completion",
        created=created,
        model=model,
        choices=[Choice(index=0, message=message, finish_reason=finish_reason)],
        usage=usage,
    )


class ChunkMaker:
    """Stream chunks of one response."""

    def __init__(self, request_id: str, created: int, model: str) -> None:
        self.request_id = request_id
        self.created = created
        self.model = model
        self._started: set[int] = set()

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.request_id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
        )

    def role(self, usage: Usage | None = None) -> ChatCompletionChunk:
        """The first chunk: the role alone."""
        return self._chunk([ChunkChoice(index=0, delta=DeltaMessage(role="assistant"))], usage)

    def delta(
        self, d: OutputDelta, finish_reason: str | None = None, usage: Usage | None = None
    ) -> ChatCompletionChunk:
        """A chunk of ``d``'s reasoning, content and call pieces. A call's first piece
        carries its index, id, type and name (and its first arguments text); later
        pieces its index and more arguments text."""
        calls: list[DeltaToolCall] = []
        for c in d.tool_calls:
            if c.index in self._started:
                calls.append(
                    DeltaToolCall(index=c.index, function=DeltaFunctionCall(arguments=c.arguments))
                )
            else:
                self._started.add(c.index)
                calls.append(
                    DeltaToolCall(
                        index=c.index,
                        id=c.id,
                        type="function",
                        function=DeltaFunctionCall(name=c.name, arguments=c.arguments),
                    )
                )
        delta = DeltaMessage(
            content=d.content or None, reasoning=d.reasoning or None, tool_calls=calls
        )
        return self._chunk([ChunkChoice(index=0, delta=delta, finish_reason=finish_reason)], usage)

    def usage(self, usage: Usage) -> ChatCompletionChunk:
        """The usage chunk (``stream_options.include_usage``): no choices."""
        return self._chunk([], usage)


def fold_chunks(
    chunks: Sequence[ChatCompletionChunk],
) -> tuple[ChatMessage, str | None, Usage | None]:
    """What a client rebuilds from a stream: the message, the finish reason and the
    usage (when a usage chunk came)."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]
    finish: str | None = None
    usage: Usage | None = None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            d = choice.delta
            finish = choice.finish_reason or finish
            reasoning.append(d.reasoning or "")
            content.append(d.content or "")
            for c in d.tool_calls:
                fn = c.function or DeltaFunctionCall()
                parts = calls.setdefault(c.index, [c.id or "", fn.name or ""])
                parts.append(fn.arguments or "")
    message = ChatMessage(
        content="".join(content) or None,
        reasoning="".join(reasoning) or None,
        tool_calls=[
            ToolCall(id=p[0], function=FunctionCall(name=p[1], arguments="".join(p[2:])))
            for _, p in sorted(calls.items())
        ],
    )
    return message, finish, usage
