"""The shared machine of families whose reasoning markers are single special tokens.

A family file subclasses `ThinkTagsParser` and sets its markers as class attributes;
it overrides `default_phase` where its kwargs or habits decide how a turn starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .base import AnswerStart, Phase, ReasoningError, ReasoningParser, ReasoningTracker, TextSplit

if TYPE_CHECKING:
    from tokenization import Tokenizer


def thinking_switch(kwargs: Mapping[str, Any], keys: Sequence[str], default: bool) -> bool:
    """The value of the first of ``keys`` present in the chat-template kwargs."""
    for key in keys:
        if key in kwargs and kwargs[key] is not None:
            return bool(kwargs[key])
    return default


class ThinkTagsParser(ReasoningParser):
    #: the marker that opens reasoning, one special token
    start_marker: ClassVar[str] = "<think>"
    #: the marker that closes reasoning, one special token (not content)
    end_marker: ClassVar[str] = "</think>"
    #: markers that close reasoning and are themselves the answer's first token
    implicit_end_markers: ClassVar[tuple[str, ...]] = ()
    #: markers that start a turn: a backward scan of the prompt stops at one
    turn_markers: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.special_markers = (cls.start_marker, cls.end_marker, *cls.implicit_end_markers)

    def __init__(self, tokenizer: Tokenizer, chat_template_kwargs: Mapping[str, Any] | None = None):
        super().__init__(tokenizer, chat_template_kwargs)
        self.start_id = self._marker_id(self.start_marker)
        self.end_id = self._marker_id(self.end_marker)
        self._implicit = tuple(self._marker_id(m) for m in self.implicit_end_markers)
        # Turn markers only bound the prompt scan; a vocabulary without them is fine.
        self._turn_ids = frozenset(
            t for t in (tokenizer.special_tokens.get(m) for m in self.turn_markers) if t is not None
        )
        self._token_bytes = tokenizer.token_bytes

    def _marker_id(self, marker: str) -> int:
        tid = self.tokenizer.special_tokens.get(marker)
        if tid is None:
            raise ReasoningError(
                f"reasoning parser {self.name!r} needs the marker {marker!r} as one special "
                f"token, and the vocabulary {self.tokenizer.name!r} has no such token"
            )
        return tid

    @property
    def implicit_end_ids(self) -> Sequence[int]:
        return self._implicit

    def default_phase(self) -> Phase:
        """How the output starts when the prompt's current turn holds no marker."""
        return Phase.UNDECIDED

    def prompt_phase(self, prompt_token_ids: Sequence[int]) -> Phase:
        for tid in reversed(prompt_token_ids):
            if tid == self.end_id:
                return Phase.ANSWER
            if tid == self.start_id:
                return Phase.THINKING
            if tid in self._turn_ids:
                break
        return self.default_phase()

    def new_tracker(self, phase: Phase) -> ReasoningTracker:
        return ThinkTagsTracker(self, phase)


class ThinkTagsTracker(ReasoningTracker):
    __slots__ = ("_start", "_end", "_implicit", "_tb")

    def __init__(self, parser: ThinkTagsParser, phase: Phase) -> None:
        super().__init__(phase)
        self._start = parser.start_id
        self._end = parser.end_id
        self._implicit = frozenset(parser.implicit_end_ids)
        self._tb = parser.tokenizer.token_bytes

    def start_marker_continuations(self) -> Sequence[int]:
        return (self._start,) if self.phase == Phase.UNDECIDED else ()

    def end_marker_ids(self) -> Sequence[int]:
        return (self._end,) if self.phase == Phase.THINKING else ()

    def _snapshot(self) -> Any:
        return (self.phase, self.num_reasoning_tokens)

    def _restore(self, snapshot: Any) -> None:
        self.phase, self.num_reasoning_tokens = snapshot

    def _flush_text(self) -> TextSplit:
        return TextSplit(b"", b"")

    def _advance(
        self, token_ids: Sequence[int], want_text: bool
    ) -> tuple[AnswerStart | None, TextSplit | None]:
        start: AnswerStart | None = None
        reasoning: list[bytes] = []
        content: list[bytes] = []
        tb = self._tb
        for i, tid in enumerate(token_ids):
            phase = self.phase
            if phase == Phase.ANSWER:
                if not want_text:
                    break
                content.append(tb(tid))
                continue
            if phase == Phase.UNDECIDED:
                if tid == self._start:
                    self.phase = Phase.THINKING
                    continue
                self.phase = Phase.ANSWER
                start = AnswerStart(i)
                if want_text:
                    content.append(tb(tid))
                continue
            # THINKING
            if tid == self._end:
                self.phase = Phase.ANSWER
                start = AnswerStart(i + 1)
            elif tid in self._implicit:
                self.phase = Phase.ANSWER
                start = AnswerStart(i)
                if want_text:
                    content.append(tb(tid))
            elif tid != self._start:
                self.num_reasoning_tokens += 1
                if want_text:
                    reasoning.append(tb(tid))
        text = TextSplit(b"".join(reasoning), b"".join(content)) if want_text else None
        return start, text
