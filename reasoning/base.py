"""What every reasoning parser provides, to the engine and to the front end.

A parser is built once per (tokenizer, chat-template kwargs). It hands out one
`ReasoningTracker` per request: a small state machine fed the request's output token
ids in order. The engine reads its `phase` to gate the grammar; the front end reads
its bytes to split `reasoning` from `content`. Both sides drive the same machine, so
they cannot disagree on where the thinking ends.

Phases of a tracker:

- ``THINKING``: inside reasoning; the grammar is off.
- ``UNDECIDED``: the next tokens may open reasoning (``start_marker_continuations``
  says which) or begin the answer. The engine lets the grammar run tentatively and
  rolls it back if reasoning opens.
- ``ANSWER``: reasoning is over or absent; every further token belongs to the answer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

if TYPE_CHECKING:
    from tokenization import Tokenizer


class Phase(IntEnum):
    THINKING = 0
    UNDECIDED = 1
    ANSWER = 2


class AnswerStart(NamedTuple):
    """Where the answer begins, relative to the token ids of the `advance` call that
    decided it.

    ``index`` is the position of the first answer token: ``len(ids)`` when the last
    fed token closed the reasoning; the position of the closing token itself when the
    family counts it as content (an implicit end, such as Qwen3's ``<tool_call>``);
    negative when tokens fed by earlier calls already belong to the answer (an
    undecided stretch that turned out to be the answer). ``prefix`` holds answer bytes
    that precede ``ids[index]``: the tail of a token that finished a text marker.
    """

    index: int
    prefix: bytes = b""


class TextSplit(NamedTuple):
    """Bytes of one `ReasoningTracker.split_bytes` call: reasoning and content, markers
    removed. Bytes whose side is not known yet are held back until a later call."""

    reasoning: bytes
    content: bytes


class ReasoningError(ValueError):
    """A parser cannot serve this tokenizer or these kwargs (a marker is missing, ...)."""


class ReasoningTracker(ABC):
    """The per-request state machine. Work per call is proportional to the new ids."""

    __slots__ = ("phase", "num_reasoning_tokens", "_checkpoints")

    #: how many recent `advance`/`split_bytes` calls `rollback` can undo
    ROLLBACK_WINDOW: ClassVar[int] = 16

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        self.num_reasoning_tokens = 0
        # (state before the call, the call's ids, whether it was a text call)
        self._checkpoints: deque[tuple[Any, list[int], bool]] = deque(maxlen=self.ROLLBACK_WINDOW)

    # ----- what a family implements -------------------------------------------

    @abstractmethod
    def _advance(
        self, token_ids: Sequence[int], want_text: bool
    ) -> tuple[AnswerStart | None, TextSplit | None]:
        """Consume ``token_ids``; update ``phase`` and ``num_reasoning_tokens``.

        Returns where the answer began (only on the call that leaves THINKING or
        UNDECIDED for ANSWER), and, when ``want_text``, the bytes split."""

    @abstractmethod
    def _flush_text(self) -> TextSplit:
        """Bytes still held back when the output ends."""

    @abstractmethod
    def _snapshot(self) -> Any:
        """An immutable copy of the whole state (for `rollback`)."""

    @abstractmethod
    def _restore(self, snapshot: Any) -> None: ...

    def start_marker_continuations(self) -> Sequence[int]:
        """In the UNDECIDED phase: the ids that continue the opening of reasoning from
        here (the engine allows them beside the grammar's own)."""
        return ()

    def end_marker_ids(self) -> Sequence[int]:
        """In the THINKING phase: the ids that close reasoning from here, in order (the
        engine forces them when a reasoning budget runs out)."""
        return ()

    # ----- the public surface ------------------------------------------------

    def advance(self, token_ids: Sequence[int]) -> AnswerStart | None:
        """Engine side: feed new output ids (one, or several with speculative decoding).

        Returns `AnswerStart` on the call in which the answer begins, else None."""
        self._checkpoints.append((self._snapshot(), list(token_ids), False))
        return self._advance(token_ids, False)[0]

    def split_bytes(self, token_ids: Sequence[int]) -> tuple[TextSplit, AnswerStart | None]:
        """Front-end side: like `advance`, and also the reasoning and content bytes."""
        self._checkpoints.append((self._snapshot(), list(token_ids), True))
        start, text = self._advance(token_ids, True)
        assert text is not None
        return text, start

    def flush(self) -> TextSplit:
        """At the end of the output: the bytes still held back."""
        return self._flush_text()

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` fed ids (within the last `ROLLBACK_WINDOW` calls):
        the state becomes that of a tracker never fed them. A call undone in part is
        replayed in its own mode (engine or text), its output discarded; text already
        returned for undone ids is the caller's to discard."""
        if num_tokens <= 0:
            return
        if num_tokens > sum(len(ids) for _, ids, _ in self._checkpoints):
            raise ValueError("rollback reaches past the tracker's rollback window")
        while True:
            snap, ids, want_text = self._checkpoints.pop()
            self._restore(snap)
            if len(ids) > num_tokens:
                keep = ids[: len(ids) - num_tokens]
                self._checkpoints.append((self._snapshot(), keep, want_text))
                self._advance(keep, want_text)
                return
            num_tokens -= len(ids)
            if num_tokens == 0:
                return

    @property
    def ended(self) -> bool:
        return self.phase == Phase.ANSWER


class ReasoningParser(ABC):
    """One family's reasoning format, bound to a tokenizer and chat-template kwargs.

    Construction validates the family's markers against the vocabulary and raises
    `ReasoningError` naming the parser and the missing marker.
    """

    #: the registry name (``--reasoning-parser``); set by `register_reasoning_parser`
    name: ClassVar[str] = ""

    #: markers that must each be one special token of the vocabulary (tests extend a
    #: base vocabulary with them for families whose own vocabulary is not bundled)
    special_markers: ClassVar[tuple[str, ...]] = ()

    #: bytes the family writes between the end of reasoning and the answer (Qwen3:
    #: ``</think>\n\n``); the engine allows them before the grammar's first token
    content_separator: ClassVar[bytes] = b""

    def __init__(self, tokenizer: Tokenizer, chat_template_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.kwargs: dict[str, Any] = dict(chat_template_kwargs or {})

    @abstractmethod
    def prompt_phase(self, prompt_token_ids: Sequence[int]) -> Phase:
        """The phase the output starts in, from the rendered prompt and the kwargs."""

    @abstractmethod
    def new_tracker(self, phase: Phase) -> ReasoningTracker:
        """A tracker for one output that starts in ``phase``."""

    @property
    def implicit_end_ids(self) -> Sequence[int]:
        """Ids that end reasoning and are themselves the answer's first token."""
        return ()

    # ----- derived -----------------------------------------------------------

    def reasoning_ended(self, prompt_token_ids: Sequence[int]) -> bool:
        """What the front end sends as ``reasoning_ended``."""
        return self.prompt_phase(prompt_token_ids) == Phase.ANSWER

    def tracker(
        self, prompt_token_ids: Sequence[int] = (), reasoning_ended: bool | None = None
    ) -> ReasoningTracker:
        """The tracker for one request. ``reasoning_ended`` True (or None: the front end
        set no reasoning parser) starts in ANSWER; False starts where the prompt leaves
        the output, reasoning at the latest."""
        if reasoning_ended is None or reasoning_ended:
            return self.new_tracker(Phase.ANSWER)
        phase = self.prompt_phase(prompt_token_ids)
        return self.new_tracker(Phase.THINKING if phase == Phase.ANSWER else phase)

    def split(
        self,
        output_token_ids: Sequence[int],
        prompt_token_ids: Sequence[int] = (),
        reasoning_ended: bool | None | Literal["prompt"] = "prompt",
    ) -> tuple[str | None, str | None]:
        """Whole output to (reasoning, content); None where a side is empty.
        ``reasoning_ended`` as for `tracker`; by default what `reasoning_ended` says of
        the prompt (as the front end sends it)."""
        stream = self.stream(prompt_token_ids, reasoning_ended)
        a = stream.push(output_token_ids)
        b = stream.finish()
        return (a.reasoning + b.reasoning) or None, (a.content + b.content) or None

    def stream(
        self,
        prompt_token_ids: Sequence[int] = (),
        reasoning_ended: bool | None | Literal["prompt"] = "prompt",
        *,
        include_reasoning: bool = True,
    ) -> ReasoningStream:
        """A stream splitter for one output; ``reasoning_ended`` as for `split`."""
        if reasoning_ended == "prompt":
            reasoning_ended = self.reasoning_ended(prompt_token_ids)
        return ReasoningStream(
            self.tracker(prompt_token_ids, reasoning_ended), include_reasoning=include_reasoning
        )


class DeltaSplit(NamedTuple):
    reasoning: str
    content: str


class ReasoningStream:
    """Splits a streamed output, delta by delta, into reasoning and content text.

    The pieces concatenate to `ReasoningParser.split` of the whole output, whatever
    the chunking; a marker cut across deltas is held back until it resolves.
    """

    __slots__ = ("tracker", "include_reasoning", "_r", "_c")

    def __init__(self, tracker: ReasoningTracker, *, include_reasoning: bool = True) -> None:
        import codecs

        self.tracker = tracker
        self.include_reasoning = include_reasoning
        self._r = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._c = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Sequence[int]) -> DeltaSplit:
        text, _ = self.tracker.split_bytes(token_ids)
        return self._decode(text, final=False)

    def finish(self) -> DeltaSplit:
        return self._decode(self.tracker.flush(), final=True)

    def _decode(self, text: TextSplit, final: bool) -> DeltaSplit:
        r = self._r.decode(text.reasoning, final) if (text.reasoning or final) else ""
        c = self._c.decode(text.content, final) if (text.content or final) else ""
        return DeltaSplit(r if self.include_reasoning else "", c)

    @property
    def num_reasoning_tokens(self) -> int:
        return self.tracker.num_reasoning_tokens
