"""Cohere Command A Reasoning: ``<|START_THINKING|>`` ... ``<|END_THINKING|>``, single
tokens. The model opens reasoning itself. What follows the end marker (the model writes
``<|START_RESPONSE|>`` or ``<|START_ACTION|>`` next) is content, left to the front end.
"""

from __future__ import annotations

from .think_tags import ThinkTagsParser


class CohereCommandReasoningParser(ThinkTagsParser):
    start_marker = "<|START_THINKING|>"
    end_marker = "<|END_THINKING|>"
    turn_markers = ("<|START_OF_TURN_TOKEN|>",)
