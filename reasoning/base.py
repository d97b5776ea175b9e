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

Where the output starts (one rule for every family): the prompt decides first. When
the current turn of the rendered prompt holds reasoning markers, the last one says
where the output starts (an opened block: THINKING; a closed one: ANSWER; Harmony:
the message its prompt leaves open), whatever the chat-template kwargs say: the model
continues the prompt it is given, and a template that opens ``<think>`` although
thinking was switched off still has the model think. Only where the current turn
holds no marker do the kwargs (``enable_thinking``, ``thinking``) and the family's
habit decide, in `ReasoningParser.default_phase`.

Layout (one rule for the engine and the front end): right after an explicit end
marker (``</think>``, not an implicit end such as Qwen3's ``<tool_call>``), the
family's template writes a separator before the answer (`content_separator`; Qwen3:
``\n\n``). The output's pieces after the end marker (each token, and first the bytes
a text marker's last token carries after the marker) are layout as long as each one
continues the separator whole; the first piece that does not (a token running past
the separator or leaving it) ends the layout and begins the answer, whole. Layout is
neither reasoning nor content, and the grammar never sees it: the engine allows the
tokens that continue the separator beside the grammar's own
(`ReasoningTracker.layout_continuations`) and does not feed them to it
(`ReasoningTracker.take_layout`). So the content of an answer is exactly the text its
grammar accepted; where the family wraps its answer (ERNIE's ``<response>``), a
separator written whole is the wrapper's opening, and the wrapper then takes its own
tags and padding out of that text.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
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
    that precede ``ids[index]``: the tail of a token that finished a text marker,
    unless that tail is layout (see the module docstring).
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
    """The per-request state machine. Work per call is proportional to the new ids.

    A family's machine calls `_open_layout` when an explicit end marker closes the
    reasoning, and passes each later answer piece through `_take_layout` while
    ``_layout`` is non-empty (see Layout in the module docstring)."""

    __slots__ = ("phase", "num_reasoning_tokens", "_checkpoints", "_parser", "_layout", "_took")

    #: how many recent `advance`/`split_bytes` calls `rollback` can undo
    ROLLBACK_WINDOW: ClassVar[int] = 16

    def __init__(self, parser: ReasoningParser, phase: Phase) -> None:
        self.phase = phase
        self.num_reasoning_tokens = 0
        self._parser = parser
        #: what is left of the separator while the output may still be writing it
        self._layout = b""
        #: whether the last call read a piece as layout (for `take_layout`)
        self._took = False
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

    def ending_tokens(self) -> tuple[Hashable, Sequence[int]] | None:
        """In the THINKING phase: the ids that, fed now, may close reasoning with a token
        that carries bytes after the end marker (answer bytes, unless layout takes
        them), and a key for the state they were read from. Two states with the same
        key have the same ids, and each id fed in either gives the same `AnswerStart`
        (so a caller may cache what it derives from them per key). None where no token
        can (an end marker that is one special token: the default). A superset: which
        of them really carry answer bytes, and which, `probe` says."""
        return None

    def probe(self, token_id: int) -> AnswerStart | None:
        """What `advance` of ``token_id`` would return now, the state left as it was
        (the rollback window included)."""
        saved, took = self._save(), self._took
        try:
            return self._advance((token_id,), False)[0]
        finally:
            self._load(saved)
            self._took = took

    # ----- layout (for the family machines) ---------------------------------------

    def _open_layout(self) -> None:
        """An explicit end marker closed the reasoning: the separator may follow."""
        self._layout = self._parser.content_separator

    def _take_layout(self, piece: bytes) -> bool:
        """Whether ``piece`` (the bytes of the next answer piece) is layout: it
        continues the separator whole. Either way the state moves on: past the piece,
        or out of the layout for good (``_layout`` is empty after the piece that
        completes the separator too: the caller then hands the whole separator to the
        family's answer wrapper, if any). Call only while ``_layout`` is non-empty."""
        left = self._layout
        if piece and left.startswith(piece):
            self._layout = left[len(piece) :]
            self._took = True
            return True
        self._layout = b""
        return False

    # ----- the public surface ------------------------------------------------

    def advance(self, token_ids: Sequence[int]) -> AnswerStart | None:
        """Engine side: feed new output ids (one, or several with speculative decoding).

        Returns `AnswerStart` on the call in which the answer begins, else None. In
        ANSWER it reads nothing but layout, so the engine feeds answer tokens here only
        while `in_layout` (through `take_layout`)."""
        self._checkpoints.append((self._save(), list(token_ids), False))
        return self._advance(token_ids, False)[0]

    def split_bytes(self, token_ids: Sequence[int]) -> tuple[TextSplit, AnswerStart | None]:
        """Front-end side: like `advance`, and also the reasoning and content bytes
        (layout in neither)."""
        self._checkpoints.append((self._save(), list(token_ids), True))
        start, text = self._advance(token_ids, True)
        assert text is not None
        return text, start

    @property
    def in_layout(self) -> bool:
        """In ANSWER, right after an explicit end marker: the next token may still be
        layout."""
        return bool(self._layout)

    def layout_continuations(self) -> Sequence[int]:
        """While `in_layout`: the ids whose bytes continue the separator whole (the
        engine allows them beside the grammar's own). Cached per parser."""
        return self._parser.layout_ids(self._layout) if self._layout else ()

    def take_layout(self, token_id: int) -> bool:
        """Engine side, while `in_layout`: feed one answer token; whether it is layout
        (then the grammar must not see it). `rollback` undoes it like `advance`."""
        self._took = False
        self.advance((token_id,))
        return self._took

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
            self._load(snap)
            if len(ids) > num_tokens:
                keep = ids[: len(ids) - num_tokens]
                self._checkpoints.append((self._save(), keep, want_text))
                self._advance(keep, want_text)
                return
            num_tokens -= len(ids)
            if num_tokens == 0:
                return

    def _save(self) -> Any:
        return self._layout, self._snapshot()

    def _load(self, saved: Any) -> None:
        self._layout, snapshot = saved
        self._restore(snapshot)

    @property
    def ended(self) -> bool:
        return self.phase == Phase.ANSWER


class ReasoningParser(ABC):
    """One family's reasoning format, bound to a tokenizer and chat-template kwargs.

    Construction validates the family's markers against the vocabulary and raises
    `ReasoningError` naming the parser and the missing marker. ``name`` is the name the
    parser was created under (`create_reasoning_parser` passes it; a class may serve
    under several), else the class's name.
    """

    #: markers that must each be one special token of the vocabulary (tests extend a
    #: base vocabulary with them for families whose own vocabulary is not bundled)
    special_markers: ClassVar[tuple[str, ...]] = ()

    #: the layout the family's template writes between an explicit end marker and the
    #: answer (Qwen3: ``\n\n`` after ``</think>``); see Layout in the module docstring
    content_separator: ClassVar[bytes] = b""

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
    ):
        self.name = name or type(self).__name__
        self.tokenizer = tokenizer
        self.kwargs: dict[str, Any] = dict(chat_template_kwargs or {})
        self._layout_ids: dict[bytes, tuple[int, ...]] = {}

    @abstractmethod
    def marker_phase(self, prompt_token_ids: Sequence[int]) -> Phase | None:
        """The phase the reasoning markers in the prompt's current turn leave the output
        in, or None when the current turn holds none."""

    def default_phase(self) -> Phase:
        """The phase the output starts in when the prompt's current turn holds no
        marker: the kwargs' switch and the family's habit."""
        return Phase.UNDECIDED

    @abstractmethod
    def new_tracker(self, phase: Phase) -> ReasoningTracker:
        """A tracker for one output that starts in ``phase``."""

    @property
    def implicit_end_ids(self) -> Sequence[int]:
        """Ids that end reasoning and are themselves the answer's first token."""
        return ()

    def layout_ids(self, left: bytes) -> tuple[int, ...]:
        """The ids whose bytes are a non-empty prefix of ``left`` (what is still to come
        of the separator), special tokens included: exactly the tokens the layout rule
        reads as layout there. Cached."""
        ids = self._layout_ids.get(left)
        if ids is None:
            from .vocab import vocab_index

            ids = self._layout_ids[left] = vocab_index(self.tokenizer).prefixes_of(
                left, special=True
            )
        return ids

    # ----- derived -----------------------------------------------------------

    def prompt_phase(self, prompt_token_ids: Sequence[int]) -> Phase:
        """The phase the output starts in: the prompt's markers, else `default_phase`
        (the rule in the module docstring)."""
        phase = self.marker_phase(prompt_token_ids)
        return self.default_phase() if phase is None else phase

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
        the prompt (as the front end sends it).

        Markers and layout are in neither side: after Qwen3's ``</think>\n\n`` the
        content starts at the answer's first character, as the front end returns it
        (the front end's split is `stream` over the same tracker, so the two agree
        whatever the chunking). What the model wrote inside the reasoning is kept as
        written."""
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
    the chunking; a marker cut across deltas is held back until it resolves. Without a
    tracker (no reasoning parser) everything is content; ``token_bytes`` then reads
    the ids.

    Each side is decoded on its own, and a UTF-8 sequence the model left unfinished is
    replaced (U+FFFD) where that side ends: the reasoning's at the end of the thinking,
    in the push that ends it, not at the end of the output. So the replacement stands
    where the model wrote the bytes, before the end marker, whatever the chunking (and
    a newline before it is not the last character of the thinking).
    """

    __slots__ = ("tracker", "include_reasoning", "_tb", "_r", "_c", "answer_start")

    def __init__(
        self,
        tracker: ReasoningTracker | None,
        *,
        include_reasoning: bool = True,
        token_bytes: Callable[[int], bytes] | None = None,
    ) -> None:
        import codecs

        if tracker is None and token_bytes is None:
            raise ValueError("a stream without a tracker needs token_bytes")
        self.tracker = tracker
        self.include_reasoning = include_reasoning
        self._tb = token_bytes
        self._r = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._c = codecs.getincrementaldecoder("utf-8")(errors="replace")
        #: where the answer began among the ids of the last `push` (None: not there)
        self.answer_start: AnswerStart | None = None

    def push(self, token_ids: Sequence[int]) -> DeltaSplit:
        if self.tracker is None:
            assert self._tb is not None
            return self._decode(TextSplit(b"", b"".join(map(self._tb, token_ids))), final=False)
        text, self.answer_start = self.tracker.split_bytes(token_ids)
        return self._decode(text, final=False, thinking_over=self.tracker.ended)

    def finish(self, tail: bytes = b"") -> DeltaSplit:
        """The output ended. ``tail``: the first bytes of a last token cut short (by a
        stop string); they join the side the output ended on, after anything held."""
        if self.tracker is None:
            return self._decode(TextSplit(b"", tail), final=True)
        thinking = self.tracker.phase == Phase.THINKING
        r, c = self.tracker.flush()
        if tail:
            r, c = (r + tail, c) if thinking else (r, c + tail)
        return self._decode(TextSplit(r, c), final=True)

    def _decode(self, text: TextSplit, final: bool, thinking_over: bool = False) -> DeltaSplit:
        """``thinking_over``: no reasoning byte can follow (the answer began), so the
        reasoning's unfinished UTF-8 sequence is replaced now (see the class docstring)."""
        end_r = final or thinking_over
        r = self._r.decode(text.reasoning, end_r) if (text.reasoning or end_r) else ""
        c = self._c.decode(text.content, final) if (text.content or final) else ""
        return DeltaSplit(r if self.include_reasoning else "", c)

    @property
    def num_reasoning_tokens(self) -> int:
        return self.tracker.num_reasoning_tokens if self.tracker is not None else 0
