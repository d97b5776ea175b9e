"""Kimi K2 (Thinking): ``<think>`` ... ``</think>``, single tokens.

The output starts inside reasoning; a ``<think>`` the model writes is dropped.
``<|tool_calls_section_begin|>`` while thinking ends the thinking and is the answer's
first token. With thinking off, every output token is content.

Kwargs: ``thinking`` or ``enable_thinking`` (default true).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import Phase
from .think_tags import ThinkTagsParser, thinking_switch

if TYPE_CHECKING:
    from tokenization import Tokenizer


class KimiK2ReasoningParser(ThinkTagsParser):
    start_marker = "<think>"
    end_marker = "</think>"
    implicit_end_markers = ("<|tool_calls_section_begin|>",)
    turn_markers = ("<|im_assistant|>", "<|im_user|>", "<|im_system|>")

    def __init__(self, tokenizer: Tokenizer, chat_template_kwargs: Mapping[str, Any] | None = None):
        super().__init__(tokenizer, chat_template_kwargs)
        self.thinking = thinking_switch(self.kwargs, ("thinking", "enable_thinking"), True)

    def default_phase(self) -> Phase:
        return Phase.THINKING

    def prompt_phase(self, prompt_token_ids: Sequence[int]) -> Phase:
        return super().prompt_phase(prompt_token_ids) if self.thinking else Phase.ANSWER
