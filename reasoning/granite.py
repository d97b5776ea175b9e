"""IBM Granite 3.x: text markers, several ordinary tokens each, matched on bytes.

The model opens reasoning with ``Here is my thought process:`` and closes it with
``Here is my response:`` (``Here's`` also occurs, seen from quantized models). The
output must start with the start phrase to be reasoning; otherwise it is all content.
The token that finishes the end phrase may carry the first characters of the answer
(reported as `AnswerStart.prefix`).
"""

from __future__ import annotations

from .text_markers import TextMarkersParser


class GraniteReasoningParser(TextMarkersParser):
    start_markers = ("Here is my thought process:", "Here's my thought process:")
    end_markers = ("Here is my response:", "Here's my response:")
    turn_markers = ("<|start_of_role|>",)
    content_separator = b"\n"
