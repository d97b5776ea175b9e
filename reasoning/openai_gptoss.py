"""OpenAI gpt-oss (Harmony): reasoning is the body of analysis messages.

A message is ``<|start|>assistant<|channel|>NAME ...<|message|>BODY<|end|>`` (a final
message ends with ``<|return|>``, a tool call with ``<|call|>``); the prompt ends with
``<|start|>assistant``, so the first message of the output starts at ``<|channel|>``.

The machine: at a message start (the output's start, or right after an analysis
message's ``<|end|>``) the phase is UNDECIDED. While the tokens so far spell the
analysis header exactly (``<|channel|>analysis<|message|>``, preceded by
``<|start|>assistant`` after ``<|end|>``; special tokens by id, the names by bytes,
any tokenization), it stays UNDECIDED; once the header is complete the phase is
THINKING until ``<|end|>``. Any other header (``final``, ``commentary``, a recipient
such as ``analysis to=python``) makes that message's first token the answer's first
token. Reasoning is the analysis bodies, joined by ``\\n`` when there are several;
content is the raw text from the answer's first token on, headers included (the
front end's Harmony tool-call format reads it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import AnswerStart, Phase, ReasoningParser, ReasoningTracker, TextSplit
from .text_markers import require_special
from .vocab import vocab_index

if TYPE_CHECKING:
    from tokenization import Tokenizer

#: joins the bodies of consecutive analysis messages in the reasoning text
ANALYSIS_SEPARATOR = b"\n"

# Header segments: a special token's id, or the bytes of a name. The full header
# follows an ``<|end|>``; the output's first message starts at `_SHORT`.
_START, _ASSISTANT, _CHANNEL, _ANALYSIS, _MESSAGE = range(5)
_SHORT = _CHANNEL


class GptOssReasoningParser(ReasoningParser):
    special_markers = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
    ):
        super().__init__(tokenizer, chat_template_kwargs, name=name)
        self.start_id, self.channel_id, self.message_id, self.end_id = (
            require_special(self, m) for m in self.special_markers
        )
        self.segments: tuple[int | bytes, ...] = (
            self.start_id,
            b"assistant",
            self.channel_id,
            b"analysis",
            self.message_id,
        )
        # Ids that close a message other than <|end|> (absent ones are ignored).
        self._closing = frozenset(
            tokenizer.special_tokens[m]
            for m in ("<|end|>", "<|return|>", "<|call|>")
            if m in tokenizer.special_tokens
        )
        self._continuations: dict[tuple[int, int], tuple[int, ...]] = {}

    def marker_phase(self, prompt_token_ids: Sequence[int]) -> Phase:
        """UNDECIDED when the prompt ends with ``<|start|>assistant``; THINKING when it
        ends inside an analysis body it opened; ANSWER otherwise (another message's body
        is open, or the prompt does not end at a message start). The prompt always
        decides: Harmony has no kwargs that switch the analysis channel off."""
        ids = prompt_token_ids
        s = next((i for i in range(len(ids) - 1, -1, -1) if ids[i] == self.start_id), -1)
        if s < 0:
            return Phase.ANSWER
        after = ids[s + 1 :]
        if self.tokenizer.decode_bytes(after) == b"assistant":
            return Phase.UNDECIDED
        header = b"assistant<|channel|>analysis<|message|>"
        if self.message_id in after and not self._closing.intersection(after):
            m = list(after).index(self.message_id)
            if self.tokenizer.decode_bytes(after[: m + 1]) == header:
                return Phase.THINKING
        return Phase.ANSWER

    def new_tracker(self, phase: Phase) -> ReasoningTracker:
        return HarmonyTracker(self, phase)

    def continuations(self, seg: int, off: int) -> tuple[int, ...]:
        """The ids that continue the analysis header from segment ``seg``, byte ``off``."""
        key = (seg, off)
        ids = self._continuations.get(key)
        if ids is None:
            part = self.segments[seg]
            if isinstance(part, int):
                ids = (part,)
            else:
                ids = vocab_index(self.tokenizer).prefixes_of(part[off:], special=False)
            self._continuations[key] = ids
        return ids


class HarmonyTracker(ReasoningTracker):
    """State beyond the phase: in UNDECIDED, the header position (segment, byte offset),
    the header bytes so far and how many tokens they took; the number of analysis
    messages seen (for the separator)."""

    __slots__ = ("_p", "_tb", "_special", "_seg", "_off", "_held", "_undecided", "_analyses")

    def __init__(self, parser: GptOssReasoningParser, phase: Phase) -> None:
        super().__init__(parser, phase)
        self._p = parser
        self._tb = parser.tokenizer.token_bytes
        self._special = parser.tokenizer.special_ids
        self._seg, self._off = _SHORT, 0
        self._held = b""
        self._undecided = 0
        self._analyses = 1 if phase == Phase.THINKING else 0

    def start_marker_continuations(self) -> Sequence[int]:
        if self.phase != Phase.UNDECIDED:
            return ()
        return self._p.continuations(self._seg, self._off)

    def end_marker_ids(self) -> Sequence[int]:
        return (self._p.end_id,) if self.phase == Phase.THINKING else ()

    def _snapshot(self) -> Any:
        return (
            self.phase,
            self.num_reasoning_tokens,
            self._seg,
            self._off,
            self._held,
            self._undecided,
            self._analyses,
        )

    def _restore(self, snapshot: Any) -> None:
        (
            self.phase,
            self.num_reasoning_tokens,
            self._seg,
            self._off,
            self._held,
            self._undecided,
            self._analyses,
        ) = snapshot

    def _flush_text(self) -> TextSplit:
        # A header that never resolved is not reasoning: it is content.
        held, self._held = self._held, b""
        return TextSplit(b"", held)

    def _header_step(self, tid: int, data: bytes) -> bool:
        """Advance the header position by one token; False if it leaves the header."""
        part = self._p.segments[self._seg]
        if isinstance(part, int):
            if tid != part:
                return False
            self._seg += 1
            return True
        rest = part[self._off :]
        if tid in self._special or not data or not rest.startswith(data):
            return False
        self._off += len(data)
        if self._off == len(part):
            self._seg, self._off = self._seg + 1, 0
        return True

    def _advance(
        self, token_ids: Sequence[int], want_text: bool
    ) -> tuple[AnswerStart | None, TextSplit | None]:
        start: AnswerStart | None = None
        reasoning: list[bytes] = []
        content: list[bytes] = []
        tb, end_id = self._tb, self._p.end_id
        for i, tid in enumerate(token_ids):
            phase = self.phase
            if phase == Phase.ANSWER:
                if not want_text:
                    break
                content.append(tb(tid))
            elif phase == Phase.THINKING:
                if tid == end_id:
                    self.phase = Phase.UNDECIDED
                    self._seg, self._off, self._held, self._undecided = _START, 0, b"", 0
                else:
                    self.num_reasoning_tokens += 1
                    if want_text:
                        reasoning.append(tb(tid))
            else:
                data = tb(tid)
                if not self._header_step(tid, data):
                    self.phase = Phase.ANSWER
                    start = AnswerStart(i - self._undecided)
                    if want_text:
                        content.append(self._held + data)
                    self._held, self._undecided = b"", 0
                elif self._seg == len(self._p.segments):
                    self.phase = Phase.THINKING
                    self._held, self._undecided = b"", 0
                    if want_text and self._analyses:
                        reasoning.append(ANALYSIS_SEPARATOR)
                    self._analyses += 1
                else:
                    self._held += data
                    self._undecided += 1
        text = TextSplit(b"".join(reasoning), b"".join(content)) if want_text else None
        return start, text
