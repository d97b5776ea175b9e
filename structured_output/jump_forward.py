"""Jump forward: what a grammar forces next, as the tokens the model's own tokenizer
would write for it.

xgrammar's matcher gives the forced text from its state
(`GrammarMatcher.find_jump_forward_string`): the longest string every continuation the
grammar admits begins with, cut to whole UTF-8 characters. It stops before a
token-level element (a family's marker, which our sealed vocabulary makes a token the
grammar names by id), so a jump never writes a marker. How far it is trusted: as text
only. Each token of the jump is still fed to the matcher, and a token it refuses ends
the jump there (the tokens before it stay: each was accepted).

The split must be the tokenizer's own, or the model reads its output in a form it was
never trained on. Tokenizers cut text into chunks first (words with one leading space
or sign, runs of digits, of punctuation, of whitespace) and merge bytes only within a
chunk, so what follows the forced text can change only the chunk the text ends in (and,
for a run of newlines, the punctuation it follows). The jump therefore keeps the
tokenizer's tokens of the forced text up to where its last chunk begins, found by
character classes; and only where that cut is also a token boundary of the text's own
encoding (else one chunk earlier, else no jump). xgrammar's own
`find_jump_forward_tokens` splits greedily by the longest token instead, which is not
how a BPE tokenizer splits.

Where forced text stops, the grammar may allow one token alone: a token-level element
such as a marker. Finding out takes a mask of the whole vocabulary, so it is asked only
where one of the ids the grammar names as tokens is acceptable (`named_token_ids`,
read once per compiled grammar; a quick accept and roll back of each).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

#: character classes of the chunk rule: letters, digits, whitespace, anything else
_LETTER, _DIGIT, _SPACE, _OTHER = 0, 1, 2, 3


def _cls(ch: str) -> int:
    if ch.isalpha():
        return _LETTER
    if ch.isdigit() or ch.isnumeric():
        return _DIGIT
    if ch.isspace():
        return _SPACE
    return _OTHER


def last_chunk_start(text: str) -> int:
    """Where the chunk that ``text`` ends in may begin, at the earliest, once more text
    follows: the trailing run of one character class, with the one character a word or
    a punctuation run may carry in front (a space; for a word, any sign or space but a
    newline); for a trailing run of whitespace also the run before it, and for
    punctuation with an apostrophe the word before it."""
    i = len(text)
    if not i:
        return 0
    c = _cls(text[i - 1])
    while i and _cls(text[i - 1]) == c:
        i -= 1
    if c == _SPACE and i:  # newlines join the punctuation before them; spaces the word after
        c = _cls(text[i - 1])
        while i and _cls(text[i - 1]) == c:
            i -= 1
    if c == _OTHER and "'" in text[i:] and i and _cls(text[i - 1]) == _LETTER:
        c = _LETTER  # an apostrophe may join the word before it ("n't", "'s")
        while i and _cls(text[i - 1]) == c:
            i -= 1
    if i and c in (_LETTER, _OTHER):
        prev = text[i - 1]
        if prev == " " or (c == _LETTER and _cls(prev) in (_OTHER, _SPACE) and prev not in "\r\n"):
            i -= 1
    return i


#: a token-level element in xgrammar's printed grammar: ``Token(151657)``, ``Token(1, 2)``
_TOKEN_ELEMENT = re.compile(r"(?<![A-Za-z_])Token\(([0-9, ]*)\)")
#: elements that may accept a token the grammar does not name (any but those listed)
_OPEN_TOKEN_ELEMENT = re.compile(r"(?<![A-Za-z_])(?:ExcludeToken|TokenTagDispatch)\(")


def named_token_ids(grammar: Any) -> tuple[int, ...] | None:
    """The ids a compiled grammar names as token-level elements (its markers), read
    from xgrammar's printed form of it; None where a token-level element accepts any
    token but some (``any_tokens``, ``exclude_token``, a token dispatch), so that any
    special token may come. Ids that only a quoted string holds may be named too: the
    set is a superset, which costs a probe, never a wrong jump (each is checked)."""
    text = str(grammar.grammar if hasattr(grammar, "grammar") else grammar)
    if _OPEN_TOKEN_ELEMENT.search(text):
        return None
    ids: dict[int, None] = {}
    for group in _TOKEN_ELEMENT.findall(text):
        for part in group.split(","):
            if part.strip():
                ids[int(part)] = None
    return tuple(ids)


class ForcedTokens:
    """Canonical token ids of forced text, for one vocabulary.

    ``encode`` encodes ordinary text (no special tokens); ``token_bytes`` gives each
    id's bytes."""

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        token_bytes: Sequence[bytes],
        vocab_rows: int | None = None,
        marker_ids: Collection[int] = (),
    ) -> None:
        self._encode = encode
        self._bytes = token_bytes
        #: the vocabulary's special tokens: ordinary text never merges across one
        self._markers = frozenset(marker_ids)
        self.vocab_rows = len(token_bytes) if vocab_rows is None else vocab_rows
        #: one row of bitmask for `single_allowed` (made on first use)
        self._row: Any = None

    def encode(self, text: str) -> list[int]:
        """The tokenizer's ids of ``text`` (ordinary text: a sealed marker, never
        expected since xgrammar stops before one, ends it)."""
        cut = text.find("\x00")
        return self._encode(text[:cut] if cut >= 0 else text)

    def is_marker(self, token_id: int) -> bool:
        return token_id in self._markers

    def __call__(self, text: str, ids: list[int] | None = None) -> list[int]:
        """The ids that write a safe prefix of ``text`` (maybe none); ``ids``: its
        `encode`, where the caller has it."""
        cut = text.find("\x00")
        if cut >= 0:
            text = text[:cut]
        if ids is None:
            ids = self._encode(text)
        ends: list[int] = []
        at = 0
        for t in ids:
            at += len(self._bytes[t])
            ends.append(at)
        for _ in range(2):
            text = text[: last_chunk_start(text)]
            if not text:
                return []
            want = len(text.encode("utf-8"))
            n = _count_to(ends, want)
            if n:
                return ids[:n]
        return []

    def writes_all(self, ids: Sequence[int], text: str) -> bool:
        """Whether ``ids`` (a prefix of ``text``'s tokens) write the whole of it."""
        return sum(len(self._bytes[t]) for t in ids) == len(text.encode("utf-8"))

    def single_allowed(self, matcher: Any) -> int | None:
        """The one token ``matcher``'s grammar allows next, if it allows exactly one
        (one row's mask, filled and read here: call only where that is likely)."""
        import torch

        if self._row is None:
            self._row = torch.zeros((1, (self.vocab_rows + 31) // 32), dtype=torch.int32)
        row = self._row
        matcher.fill_next_token_bitmask(row, 0)
        words = row.numpy()[0].view(np.uint32)
        nonzero = np.flatnonzero(words)
        if len(nonzero) != 1:
            return None
        w = int(words[nonzero[0]])
        if w & (w - 1):
            return None
        t = int(nonzero[0]) * 32 + w.bit_length() - 1
        return t if t < self.vocab_rows else None


def _count_to(ends: list[int], want: int) -> int:
    """How many tokens end exactly at byte ``want`` (0: none does)."""
    for i, e in enumerate(ends):
        if e == want:
            return i + 1
        if e > want:
            return 0
    return 0
