"""The vocabulary seen as sorted bytes: which ids spell a given piece of text."""

from __future__ import annotations

import bisect
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenization import Tokenizer


class VocabIndex:
    """The vocabulary's non-empty token bytes, sorted: ids by exact bytes or by prefix."""

    __slots__ = ("_keys", "_ids", "_special")

    def __init__(self, tokenizer: Tokenizer) -> None:
        pairs = sorted((b, i) for i, b in enumerate(tokenizer.all_token_bytes) if b)
        self._keys = [b for b, _ in pairs]
        self._ids = [i for _, i in pairs]
        self._special = tokenizer.special_ids

    def exact(self, data: bytes) -> list[int]:
        lo = bisect.bisect_left(self._keys, data)
        hi = bisect.bisect_right(self._keys, data)
        return self._ids[lo:hi]

    def prefixes_of(self, data: bytes, *, special: bool) -> tuple[int, ...]:
        """Ids whose bytes are a non-empty prefix of ``data``, shortest first (special
        tokens among them only with ``special``)."""
        ids = (t for k in range(1, len(data) + 1) for t in self.exact(data[:k]))
        if special:
            return tuple(ids)
        return tuple(t for t in ids if t not in self._special)

    def longer_with_prefix(self, prefix: bytes) -> list[int]:
        """Ids whose bytes start with ``prefix`` and are longer than it."""
        lo = bisect.bisect_right(self._keys, prefix)
        hi = lo
        keys = self._keys
        while hi < len(keys) and keys[hi].startswith(prefix):
            hi += 1
        return self._ids[lo:hi]


_INDEXES: weakref.WeakKeyDictionary[Tokenizer, VocabIndex] = weakref.WeakKeyDictionary()


def vocab_index(tokenizer: Tokenizer) -> VocabIndex:
    """The (cached) sorted index of ``tokenizer``'s token bytes; built on first use."""
    index = _INDEXES.get(tokenizer)
    if index is None:
        index = _INDEXES[tokenizer] = VocabIndex(tokenizer)
    return index
