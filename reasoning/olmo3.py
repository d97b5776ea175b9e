"""OLMo 3 Think: plain-text ``<think>`` / ``</think>`` (ordinary tokens), matched on
bytes.

The first ``<think>`` is optional (a template may put it in the prompt): the output
starts inside reasoning, and a leading ``<think>`` is dropped. Everything before the
first ``</think>`` is reasoning.
"""

from __future__ import annotations

from .base import Phase
from .text_markers import TextMarkersParser


class Olmo3ReasoningParser(TextMarkersParser):
    start_markers = ("<think>",)
    end_markers = ("</think>",)
    turn_markers = ("<|im_start|>",)

    def default_phase(self) -> Phase:
        return Phase.THINKING
