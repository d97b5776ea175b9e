"""GLM-4.5 / 4.6: ``<think>`` ... ``</think>``, single tokens.

With thinking on, the generation prompt is a bare ``<|assistant|>`` and the model
writes ``\\n<think>`` itself: the leading newline keeps the phase UNDECIDED and is
dropped when ``<think>`` follows. With thinking off the template writes
``\\n<think></think>`` into the prompt. A ``<tool_call>`` while thinking ends the
thinking and is the answer's first token. The answer follows ``</think>\\n``.

Kwargs: ``thinking`` or ``enable_thinking`` (default true).
"""

from __future__ import annotations

from .base import Phase
from .think_tags import ThinkTagsParser, thinking_switch


class Glm45ReasoningParser(ThinkTagsParser):
    start_marker = "<think>"
    end_marker = "</think>"
    implicit_end_markers = ("<tool_call>",)
    turn_markers = ("<|assistant|>", "<|user|>", "<|system|>", "<|observation|>")
    start_lead = b"\n"
    content_separator = b"\n"

    def default_phase(self) -> Phase:
        if thinking_switch(self.kwargs, ("thinking", "enable_thinking"), True):
            return Phase.UNDECIDED
        return Phase.ANSWER
