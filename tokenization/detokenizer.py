"""Incremental detokenization for streams."""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns token ids into text piece by piece.

    A UTF-8 character split across tokens is held back until it is complete, so the
    pieces concatenate exactly to ``tokenizer.decode(all_ids)``. Work per call is
    proportional to the new ids.
    """

    __slots__ = ("_tb", "_special", "_dec")

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = False) -> None:
        self._tb = tokenizer.token_bytes
        self._special = tokenizer.special_ids if skip_special_tokens else frozenset()
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Iterable[int]) -> str:
        sp = self._special
        data = b"".join(self._tb(i) for i in token_ids if i not in sp)
        return self._dec.decode(data) if data else ""

    def push_bytes(self, data: bytes) -> str:
        return self._dec.decode(data) if data else ""

    def flush(self) -> str:
        """Whatever is held back (an incomplete character becomes U+FFFD)."""
        return self._dec.decode(b"", final=True)
