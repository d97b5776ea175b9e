"""DeepSeek-R1: ``<think>`` ... ``</think>``, single tokens.

The template opens ``<think>`` in the prompt, so the output starts inside reasoning and
may carry no start marker at all: everything before ``</think>`` is reasoning. A start
marker the model writes anyway is dropped. The answer follows ``</think>\\n\\n``.
"""

from __future__ import annotations

from .base import Phase
from .think_tags import ThinkTagsParser


class DeepSeekR1ReasoningParser(ThinkTagsParser):
    start_marker = "<think>"
    end_marker = "</think>"
    turn_markers = ("<｜Assistant｜>", "<｜User｜>")
    content_separator = b"\n\n"

    def default_phase(self) -> Phase:
        return Phase.THINKING
