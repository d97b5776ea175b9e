"""MiniMax-M2: ``<think>`` ... ``</think>``, single tokens.

The template opens ``<think>\\n`` in every generation prompt, so the output always
starts inside reasoning; a ``<think>`` the model writes anyway is dropped. The answer
follows ``</think>\\n\\n``.
"""

from __future__ import annotations

from .base import Phase
from .think_tags import ThinkTagsParser


class MiniMaxM2ReasoningParser(ThinkTagsParser):
    start_marker = "<think>"
    end_marker = "</think>"
    turn_markers = ("]~b]",)
    content_separator = b"\n\n"

    def default_phase(self) -> Phase:
        return Phase.THINKING
