"""DeepSeek-V3.1 and later: as DeepSeek-R1 when thinking is on (the template ends the
prompt with ``<think>``), and no reasoning at all when it is off (the default; the
template ends the prompt with ``</think>``): then every output token is content, even
a ``<think>`` the model might write.

Kwargs: ``thinking`` or ``enable_thinking`` (default false).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import Phase
from .deepseek_r1 import DeepSeekR1ReasoningParser
from .think_tags import thinking_switch

if TYPE_CHECKING:
    from tokenization import Tokenizer


class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):
    content_separator = b""

    def __init__(self, tokenizer: Tokenizer, chat_template_kwargs: Mapping[str, Any] | None = None):
        super().__init__(tokenizer, chat_template_kwargs)
        self.thinking = thinking_switch(self.kwargs, ("thinking", "enable_thinking"), False)

    def prompt_phase(self, prompt_token_ids: Sequence[int]) -> Phase:
        return super().prompt_phase(prompt_token_ids) if self.thinking else Phase.ANSWER
