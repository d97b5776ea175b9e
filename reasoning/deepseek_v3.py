"""DeepSeek-V3.1 and later: as DeepSeek-R1 when thinking is on (the template ends the
prompt with ``<think>``), and no reasoning at all when it is off (the default; the
template ends the prompt with ``</think>``): then the output starts in content, and a
``<think>`` the model might write is content too. As for every family, markers in the
prompt's current turn decide before the kwargs (see `reasoning.base`).

Kwargs: ``thinking`` or ``enable_thinking`` (default false).
"""

from __future__ import annotations

from .base import Phase
from .deepseek_r1 import DeepSeekR1ReasoningParser
from .think_tags import thinking_switch


class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):
    content_separator = b""

    def default_phase(self) -> Phase:
        if thinking_switch(self.kwargs, ("thinking", "enable_thinking"), False):
            return Phase.THINKING
        return Phase.ANSWER
