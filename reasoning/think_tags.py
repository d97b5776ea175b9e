"""The shared machine of families whose reasoning markers are single special tokens.

A family file subclasses `ThinkTagsParser` and sets its markers as class attributes;
it overrides `default_phase` where its kwargs or habits decide how a turn starts
(only where the prompt's current turn holds no marker: see `reasoning.base`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .answer_wrapper import AnswerWrapper, WrapperState
from .base import AnswerStart, Phase, ReasoningParser, ReasoningTracker, TextSplit
from .text_markers import current_turn, require_special, special_ids
from .vocab import vocab_index

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
    #: text the model may write before the start marker (GLM-4.5 writes ``\\n<think>``);
    #: while the output is a prefix of it (ordinary tokens) the phase stays UNDECIDED,
    #: and it is dropped when reasoning opens
    start_lead: ClassVar[bytes] = b""
    #: a wrapper the family writes around its answer, removed from content
    answer_wrapper: ClassVar[AnswerWrapper | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.special_markers = (cls.start_marker, cls.end_marker, *cls.implicit_end_markers)

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
    ):
        super().__init__(tokenizer, chat_template_kwargs, name=name)
        self.start_id = require_special(self, self.start_marker)
        self.end_id = require_special(self, self.end_marker)
        self._implicit = tuple(require_special(self, m) for m in self.implicit_end_markers)
        # Turn markers only bound the prompt scan; a vocabulary without them is fine.
        self._turn_ids = special_ids(tokenizer, self.turn_markers)
        self._lead_continuations: dict[bytes, tuple[int, ...]] = {}

    @property
    def implicit_end_ids(self) -> Sequence[int]:
        return self._implicit

    def marker_phase(self, prompt_token_ids: Sequence[int]) -> Phase | None:
        for tid in reversed(current_turn(prompt_token_ids, self._turn_ids)):
            if tid == self.end_id:
                return Phase.ANSWER
            if tid == self.start_id:
                return Phase.THINKING
        return None

    def new_tracker(self, phase: Phase) -> ReasoningTracker:
        return ThinkTagsTracker(self, phase)

    def start_continuations(self, written: bytes) -> tuple[int, ...]:
        """After ``written`` (a prefix of `start_lead`): the start marker, and the
        ordinary tokens that continue the lead."""
        ids = self._lead_continuations.get(written)
        if ids is None:
            rest = self.start_lead[len(written) :]
            lead = vocab_index(self.tokenizer).prefixes_of(rest, special=False)
            ids = self._lead_continuations[written] = (self.start_id, *lead)
        return ids


class ThinkTagsTracker(ReasoningTracker):
    """State beyond the phase: in UNDECIDED, the lead written so far (``_held``) and
    the number of tokens it took; in ANSWER, the answer wrapper's state."""

    __slots__ = (
        "_p",
        "_start",
        "_end",
        "_implicit",
        "_special",
        "_tb",
        "_held",
        "_undecided",
        "_wrap",
    )

    def __init__(self, parser: ThinkTagsParser, phase: Phase) -> None:
        super().__init__(parser, phase)
        self._p = parser
        self._start = parser.start_id
        self._end = parser.end_id
        self._implicit = frozenset(parser.implicit_end_ids)
        self._special = parser.tokenizer.special_ids
        self._tb = parser.tokenizer.token_bytes
        self._held = b""
        self._undecided = 0
        wrapper = parser.answer_wrapper
        self._wrap: WrapperState | None = wrapper.initial() if wrapper is not None else None

    def start_marker_continuations(self) -> Sequence[int]:
        if self.phase != Phase.UNDECIDED:
            return ()
        if not self._p.start_lead:
            return (self._start,)
        return self._p.start_continuations(self._held)

    def end_marker_ids(self) -> Sequence[int]:
        return (self._end,) if self.phase == Phase.THINKING else ()

    def _snapshot(self) -> Any:
        return (self.phase, self.num_reasoning_tokens, self._held, self._undecided, self._wrap)

    def _restore(self, snapshot: Any) -> None:
        self.phase, self.num_reasoning_tokens, self._held, self._undecided, self._wrap = snapshot

    def _flush_text(self) -> TextSplit:
        # An undecided lead that never opened reasoning is content.
        content, self._held = self._held, b""
        wrapper = self._p.answer_wrapper
        if wrapper is not None and self._wrap is not None:
            out, self._wrap = wrapper.feed(self._wrap, content) if content else (b"", self._wrap)
            content = out + wrapper.flush(self._wrap)
        return TextSplit(b"", content)

    def _content(self, data: bytes, out: list[bytes]) -> None:
        """Answer bytes to content, through the answer wrapper if the family has one
        (a separator written whole goes through it too, into a list nobody reads)."""
        wrapper = self._p.answer_wrapper
        if wrapper is None or self._wrap is None:
            out.append(data)
            return
        piece, self._wrap = wrapper.feed(self._wrap, data)
        out.append(piece)

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
                if self._layout and self._take_layout(tb(tid)):
                    if want_text and not self._layout:
                        self._content(self._p.content_separator, [])  # the wrapper's opening
                    continue
                if not want_text:
                    break
                self._content(tb(tid), content)
                continue
            if phase == Phase.UNDECIDED:
                if tid == self._start:
                    self.phase, self._held, self._undecided = Phase.THINKING, b"", 0
                    continue
                lead = self._p.start_lead
                if lead and tid not in self._special:
                    buf = self._held + tb(tid)
                    if lead.startswith(buf):
                        self._held = buf
                        self._undecided += 1
                        continue
                self.phase = Phase.ANSWER
                start = AnswerStart(i - self._undecided)
                if want_text:
                    self._content(self._held + tb(tid), content)
                self._held, self._undecided = b"", 0
                continue
            # THINKING
            if tid == self._end:
                self.phase = Phase.ANSWER
                start = AnswerStart(i + 1)
                self._open_layout()
            elif tid in self._implicit:
                self.phase = Phase.ANSWER
                start = AnswerStart(i)
                if want_text:
                    self._content(tb(tid), content)
            elif tid != self._start:
                self.num_reasoning_tokens += 1
                if want_text:
                    reasoning.append(tb(tid))
        text = TextSplit(b"".join(reasoning), b"".join(content)) if want_text else None
        return start, text
