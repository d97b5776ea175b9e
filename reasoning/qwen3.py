"""Qwen3 (and Qwen3.5+): ``<think>`` ... ``</think>``, single tokens.

Older Qwen3 models write ``<think>`` themselves; Qwen3.5+ templates put ``<think>\\n``
in the prompt; with ``enable_thinking: false`` the template writes
``<think>\\n\\n</think>\\n\\n`` into the prompt. A ``<tool_call>`` while thinking ends
the thinking, and is the answer's first token. The answer follows ``</think>\\n\\n``.
"""

from __future__ import annotations

from .base import Phase
from .think_tags import ThinkTagsParser, thinking_switch


class Qwen3ReasoningParser(ThinkTagsParser):
    start_marker = "<think>"
    end_marker = "</think>"
    implicit_end_markers = ("<tool_call>",)
    turn_markers = ("<|im_start|>",)
    content_separator = b"\n\n"

    def default_phase(self) -> Phase:
        if thinking_switch(self.kwargs, ("enable_thinking",), True):
            return Phase.UNDECIDED
        return Phase.ANSWER
