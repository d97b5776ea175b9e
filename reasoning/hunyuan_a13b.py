"""Hunyuan-A13B: text markers of several ordinary tokens, matched on bytes.

The model writes ``<think>\\n`` reasoning ``\\n</think>\\n<answer>\\n`` answer
``\\n</answer>``; the think block is optional, and with thinking off the template writes
``<think>\\n\\n</think>\\n`` into the prompt. Reasoning ends at ``\\n</think>\\n`` (also
found without its first newline); the answer wrapper ``<answer>`` ... ``</answer>`` and
the newlines around its tags are removed from content (see `AnswerWrapper`).
"""

from __future__ import annotations

from .answer_wrapper import AnswerWrapper
from .text_markers import TextMarkersParser


class HunyuanA13BReasoningParser(TextMarkersParser):
    start_markers = ("<think>\n",)
    end_markers = ("\n</think>\n", "</think>\n")
    turn_markers = ("<|extra_0|>",)
    answer_wrapper = AnswerWrapper(b"<answer>", b"</answer>", b"\n")
    content_separator = b"<answer>\n"
