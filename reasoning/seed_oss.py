"""Seed-OSS: ``<seed:think>`` ... ``</seed:think>``, single tokens; like Qwen3: the
model opens reasoning itself, and a template that closes it (thinking off, or a
thinking budget of 0) writes the closed block into the prompt.

Kwargs: ``enable_thinking`` (default true).
"""

from __future__ import annotations

from .base import Phase
from .think_tags import ThinkTagsParser, thinking_switch


class SeedOssReasoningParser(ThinkTagsParser):
    start_marker = "<seed:think>"
    end_marker = "</seed:think>"
    turn_markers = ("<seed:bos>",)

    def default_phase(self) -> Phase:
        if thinking_switch(self.kwargs, ("enable_thinking",), True):
            return Phase.UNDECIDED
        return Phase.ANSWER
