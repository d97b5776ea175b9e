"""Kimi K2 (Thinking): ``<think>`` ... ``</think>``, single tokens.

The output starts inside reasoning; a ``<think>`` the model writes is dropped.
``<|tool_calls_section_begin|>`` while thinking ends the thinking and is the answer's
first token. With thinking off, the output starts in content (unless the prompt itself
opens reasoning: the prompt decides first, see `reasoning.base`).

Kwargs: ``thinking`` or ``enable_thinking`` (default true).
"""

from __future__ import annotations

from .base import Phase
from .think_tags import ThinkTagsParser, thinking_switch


class KimiK2ReasoningParser(ThinkTagsParser):
    start_marker = "<think>"
    end_marker = "</think>"
    implicit_end_markers = ("<|tool_calls_section_begin|>",)
    turn_markers = ("<|im_assistant|>", "<|im_user|>", "<|im_system|>")

    def default_phase(self) -> Phase:
        if thinking_switch(self.kwargs, ("thinking", "enable_thinking"), True):
            return Phase.THINKING
        return Phase.ANSWER
