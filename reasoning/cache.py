"""One family's parsers, one per distinct chat-template kwargs.

The front end (to decide ``reasoning_ended`` and split the output) and the engine (to
gate the grammar) each keep one `ParserCache` and build every parser through it, from
the kwargs the request carries. So both read an output with a parser built alike, and
both refuse the same kwargs with the same `ReasoningError`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import ReasoningError, ReasoningParser
from .registry import create_reasoning_parser

if TYPE_CHECKING:
    from tokenization import Tokenizer


def kwargs_key(kwargs: Mapping[str, Any] | None, *, field: str = "chat-template kwargs") -> str:
    """The cache key of chat-template kwargs: their canonical JSON (None and ``{}``
    alike). Kwargs that are not JSON-like (keys that are not strings, values JSON
    cannot write, cycles, nesting too deep) raise `ReasoningError`, naming ``field``
    (what the caller calls them)."""
    value = kwargs or {}
    try:
        key = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
        # json.dumps writes int keys and tuples as if they were strings and lists
        same = json.loads(key) == value
    except (TypeError, ValueError, RecursionError) as e:
        raise ReasoningError(f"{field} {_NOT_JSON}: {e}") from None
    if not same:
        raise ReasoningError(f"{field} {_NOT_JSON}: keys that are not strings, or tuples")
    return key


_NOT_JSON = (
    "must be JSON-like (objects with string keys, lists, strings, finite numbers, booleans, null)"
)


class ParserCache:
    """Parsers of reasoning family ``name`` on ``tokenizer``, keyed by `kwargs_key`; the
    least recently used beyond ``max_size`` are dropped. Safe to share between
    threads."""

    def __init__(
        self,
        name: str,
        tokenizer: Tokenizer,
        *,
        max_size: int = 256,
        field: str = "chat-template kwargs",
    ) -> None:
        self.name = name
        #: what errors call the kwargs (the engine: ``reasoning_parser_kwargs``)
        self.field = field
        self.tokenizer = tokenizer
        self.max_size = max_size
        self._parsers: OrderedDict[str, ReasoningParser] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, kwargs: Mapping[str, Any] | None) -> ReasoningParser:
        """The parser for ``kwargs``; `ReasoningError` for kwargs it cannot take (and an
        unknown family name: `registry.UnknownNameError`)."""
        key = kwargs_key(kwargs, field=self.field)
        with self._lock:
            parser = self._parsers.get(key)
            if parser is not None:
                self._parsers.move_to_end(key)
                return parser
        parser = create_reasoning_parser(self.name, self.tokenizer, kwargs)
        with self._lock:
            self._parsers[key] = parser
            while len(self._parsers) > self.max_size:
                self._parsers.popitem(last=False)
        return parser

    def __len__(self) -> int:
        return len(self._parsers)
