"""ERNIE-4.5 Thinking: ``<think>`` ... ``</think>``, single tokens; the answer is wrapped
in ``<response>`` ... ``</response>``.

The output may start inside reasoning with no start marker (the prompt may open it):
everything before ``</think>`` is reasoning. The model writes
``abc\\n</think>\\n\\n<response>\\ndef\\n</response>\\n``, or ``abc\\n</think>\\ndef``, or
``</think>`` then newlines then a tool call. Content drops the newlines after
``</think>`` and the response wrapper with the newlines around its tags (see
`AnswerWrapper`); the tags are matched on bytes, so they may be special tokens or text.
"""

from __future__ import annotations

from .answer_wrapper import AnswerWrapper
from .base import Phase
from .think_tags import ThinkTagsParser


class Ernie45ReasoningParser(ThinkTagsParser):
    start_marker = "<think>"
    end_marker = "</think>"
    turn_markers = ("<|im_start|>", "<|end_of_sentence|>")
    answer_wrapper = AnswerWrapper(b"<response>", b"</response>", b"\n", strip_leading_pad=True)
    content_separator = b"\n\n<response>\n"

    def default_phase(self) -> Phase:
        return Phase.THINKING
