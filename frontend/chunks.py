"""A response from `OutputDelta` pieces: the whole message (`CompletionAccumulator`,
`completion`), stream chunks (`ChunkMaker`), and what a client rebuilds from chunks
(`fold_chunks`)."""

from __future__ import annotations

from collections.abc import Sequence

from .logprobs import Entry
from .protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
    Usage,
)
from .response import OutputDelta


class CompletionAccumulator:
    """Folds `OutputDelta` pieces into the whole message."""

    def __init__(self) -> None:
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]
        #: None until a delta carries log-probabilities
        self.logprobs: list[Entry] | None = None

    def add(self, delta: OutputDelta) -> None:
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
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
    *,
    logprobs: ChoiceLogprobs | None = None,
    stop_reason: str | int | None = None,
    ignored_keywords: list[str] | None = None,
) -> ChatCompletion:
    choice = Choice(
        index=0,
        message=message,
        finish_reason=finish_reason,
        logprobs=logprobs,
        stop_reason=stop_reason,
    )
    return ChatCompletion(
        id=request_id,
        object="chat.completion",
        created=created,
        model=model,
        choices=[choice],
        usage=usage,
        ignored_keywords=ignored_keywords,
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

    def role(
        self, usage: Usage | None = None, ignored_keywords: list[str] | None = None
    ) -> ChatCompletionChunk:
        """The first chunk: the role alone (and the schema keywords left out)."""
        chunk = self._chunk([ChunkChoice(index=0, delta=DeltaMessage(role="assistant"))], usage)
        chunk.ignored_keywords = ignored_keywords
        return chunk

    def delta(
        self,
        d: OutputDelta,
        finish_reason: str | None = None,
        usage: Usage | None = None,
        *,
        logprobs: ChoiceLogprobs | None = None,
        stop_reason: str | int | None = None,
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
        choice = ChunkChoice(
            index=0,
            delta=delta,
            finish_reason=finish_reason,
            logprobs=logprobs,
            stop_reason=stop_reason,
        )
        return self._chunk([choice], usage)

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
