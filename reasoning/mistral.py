"""Mistral (Magistral): ``[THINK]`` ... ``[/THINK]``, single tokens in newer tokenizers.

The output starts in content unless its first token opens reasoning; ``[TOOL_CALLS]``
while thinking ends the thinking and is the answer's first token. The turn's prompt
scan stops at ``[/INST]`` (the system prompt of Magistral itself holds ``[THINK]``).

Older tokenizers have no ``[THINK]`` token: their models write ``<think>`` ...
``</think>`` as text. A vocabulary with neither ``[THINK]`` nor ``[/THINK]`` is read
that way, on bytes; a vocabulary with only one of them is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import Phase, ReasoningParser, ReasoningTracker
from .text_markers import TextMarkersParser, require_special
from .think_tags import ThinkTagsParser

if TYPE_CHECKING:
    from tokenization import Tokenizer

_TURN_MARKERS = ("[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")


class _MistralTokens(ThinkTagsParser):
    start_marker = "[THINK]"
    end_marker = "[/THINK]"
    implicit_end_markers = ("[TOOL_CALLS]",)
    turn_markers = _TURN_MARKERS


class _MistralText(TextMarkersParser):
    start_markers = ("<think>",)
    end_markers = ("</think>",)
    implicit_end_markers = ("[TOOL_CALLS]",)
    turn_markers = _TURN_MARKERS


class MistralReasoningParser(ReasoningParser):
    special_markers = ("[THINK]", "[/THINK]", "[TOOL_CALLS]")

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
    ):
        super().__init__(tokenizer, chat_template_kwargs, name=name)
        think = [m for m in ("[THINK]", "[/THINK]") if m in tokenizer.special_tokens]
        # Validate here, so that errors name this parser: one of the pair alone is an
        # error, and [TOOL_CALLS] is needed either way.
        for marker in ("[THINK]", "[/THINK]") if think else ():
            require_special(self, marker)
        require_special(self, "[TOOL_CALLS]")
        impl = _MistralTokens if think else _MistralText
        self._impl: ReasoningParser = impl(tokenizer, chat_template_kwargs, name=self.name)
        #: whether the markers are the special tokens (else text ``<think>``)
        self.special_think_tokens = bool(think)

    @property
    def implicit_end_ids(self) -> Sequence[int]:
        return self._impl.implicit_end_ids

    def marker_phase(self, prompt_token_ids: Sequence[int]) -> Phase | None:
        return self._impl.marker_phase(prompt_token_ids)

    def default_phase(self) -> Phase:
        return self._impl.default_phase()

    def new_tracker(self, phase: Phase) -> ReasoningTracker:
        return self._impl.new_tracker(phase)
