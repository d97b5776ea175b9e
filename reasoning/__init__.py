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
from .cache import ParserCache, kwargs_key
from .registry import (
    REASONING_PARSERS,
    create_reasoning_parser,
    get_reasoning_parser_class,
    load_plugin,
    reasoning_parser_names,
    register_reasoning_parser,
)

__all__ = [
    "REASONING_PARSERS",
    "AnswerStart",
    "DeltaSplit",
    "ParserCache",
    "Phase",
    "ReasoningError",
    "ReasoningParser",
    "ReasoningStream",
    "ReasoningTracker",
    "TextSplit",
    "create_reasoning_parser",
    "get_reasoning_parser_class",
    "kwargs_key",
    "load_plugin",
    "reasoning_parser_names",
    "register_reasoning_parser",
]
