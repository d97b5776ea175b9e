"""Reasoning parsers: where each model family's thinking starts and ends."""

from .base import (
    AnswerStart,
    DeltaSplit,
    Phase,
    ReasoningError,
    ReasoningParser,
    ReasoningStream,
    ReasoningTracker,
    TextSplit,
)
from .registry import (
    create_reasoning_parser,
    get_reasoning_parser_class,
    load_plugin,
    reasoning_parser_names,
    register_reasoning_parser,
)

__all__ = [
    "AnswerStart",
    "DeltaSplit",
    "Phase",
    "ReasoningError",
    "ReasoningParser",
    "ReasoningStream",
    "ReasoningTracker",
    "TextSplit",
    "create_reasoning_parser",
    "get_reasoning_parser_class",
    "load_plugin",
    "reasoning_parser_names",
    "register_reasoning_parser",
]
