"""The tokenizer both sides share: per-id bytes, special tokens, encode and decode.

A `Tokenizer` is built by a loader (`bundled.py` for the vocabularies quicktok ships,
`hf.py` for a local Hugging Face directory) from three things: the bytes of every
token id, the special tokens by name, and a function that encodes ordinary text
(text that holds no special token). Everything else is derived here, the same way
for every source.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from .detokenizer import IncrementalDetokenizer

OrdinaryEncoder = Callable[[str], list[int]]


class Tokenizer:
    """A vocabulary with its special tokens.

    Token ids run from 0 to ``num_tokens - 1``; ids with no token (holes in a
    vocabulary) have empty bytes. ``vocab_rows`` is the number of rows of the
    model's embedding and logits, which may exceed ``num_tokens`` (Qwen3: 151,936
    rows for 151,669 tokens).
    """

    def __init__(
        self,
        *,
        name: str,
        token_bytes: Sequence[bytes],
        special_tokens: Mapping[str, int],
        encode_ordinary: OrdinaryEncoder,
        vocab_rows: int | None = None,
        eos_token_id: int | None = None,
        bos_token_id: int | None = None,
        stop_token_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self.name = name
        self._token_bytes: list[bytes] = list(token_bytes)
        self.num_tokens = len(self._token_bytes)
        self.vocab_rows = max(vocab_rows or 0, self.num_tokens)
        self.special_tokens: dict[str, int] = dict(special_tokens)
        for text, tid in self.special_tokens.items():
            if not 0 <= tid < self.num_tokens:
                raise ValueError(f"special token {text!r} has id {tid}, outside the vocabulary")
        self.special_ids: frozenset[int] = frozenset(self.special_tokens.values())
        self._encode_ordinary = encode_ordinary
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        stops = list(dict.fromkeys(stop_token_ids))
        if eos_token_id is not None and eos_token_id not in stops:
            stops.insert(0, eos_token_id)
        self.stop_token_ids: tuple[int, ...] = tuple(stops)
        self.chat_template = chat_template
        self._bytes_to_id: dict[bytes, int] | None = None
        # Longest first, so that a special token that extends another one wins.
        names = sorted(self.special_tokens, key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, names))) if names else None

    # ----- lookups -----------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one id (empty for an id the vocabulary does not define)."""
        if 0 <= token_id < self.num_tokens:
            return self._token_bytes[token_id]
        if 0 <= token_id < self.vocab_rows:
            return b""
        raise KeyError(f"token id {token_id} is outside {self.name}'s {self.vocab_rows} rows")

    @property
    def all_token_bytes(self) -> list[bytes]:
        """The bytes of every id, ``num_tokens`` long (a shared list: do not modify)."""
        return self._token_bytes

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    def token_to_id(self, text: str) -> int | None:
        """The id of a special token, or of an ordinary text that is exactly one token."""
        tid = self.special_tokens.get(text)
        if tid is not None:
            return tid
        if self._bytes_to_id is None:
            table: dict[bytes, int] = {}
            for i, b in enumerate(self._token_bytes):
                if b and i not in self.special_ids:
                    table.setdefault(b, i)
            self._bytes_to_id = table
        return self._bytes_to_id.get(text.encode("utf-8"))

    def id_of(self, text: str) -> int:
        """Like `token_to_id`, but an error naming the token and vocabulary if absent."""
        tid = self.token_to_id(text)
        if tid is None:
            raise KeyError(f"{text!r} is not a single token of the {self.name} vocabulary")
        return tid

    # ----- encode / decode ---------------------------------------------------

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of ``text``. With ``special``, special-token strings become their
        ids; without, they are encoded as ordinary text."""
        if not special or self._special_re is None:
            return self._encode_ordinary(text)
        ids: list[int] = []
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                ids.extend(self._encode_ordinary(text[pos : m.start()]))
            ids.append(self.special_tokens[m.group()])
            pos = m.end()
        if pos < len(text):
            ids.extend(self._encode_ordinary(text[pos:]))
        return ids

    def decode_bytes(self, token_ids: Iterable[int], *, skip_special_tokens: bool = False) -> bytes:
        tb = self.token_bytes
        if skip_special_tokens:
            sp = self.special_ids
            return b"".join(tb(i) for i in token_ids if i not in sp)
        return b"".join(tb(i) for i in token_ids)

    def decode(self, token_ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids``; bytes that are not valid UTF-8 become U+FFFD."""
        data = self.decode_bytes(token_ids, skip_special_tokens=skip_special_tokens)
        return data.decode("utf-8", errors="replace")

    def detokenizer(self, *, skip_special_tokens: bool = False) -> IncrementalDetokenizer:
        """A stream decoder whose pieces concatenate to `decode` of all ids."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)

    # ----- derived vocabularies ---------------------------------------------

    def with_special_tokens(self, tokens: Sequence[str], *, name: str | None = None) -> Tokenizer:
        """This vocabulary with more special tokens appended after its last id.

        Tokens it already has keep their ids. Serves families whose own vocabulary is
        not available offline: a real base vocabulary plus the family's markers."""
        new = [t for t in dict.fromkeys(tokens) if t not in self.special_tokens]
        if not new:
            return self
        token_bytes = list(self._token_bytes)
        specials = dict(self.special_tokens)
        for t in new:
            specials[t] = len(token_bytes)
            token_bytes.append(t.encode("utf-8"))
        rows = self.vocab_rows
        if len(token_bytes) > rows:
            rows = -(-len(token_bytes) // 64) * 64
        return Tokenizer(
            name=name or f"{self.name}+{len(new)}",
            token_bytes=token_bytes,
            special_tokens=specials,
            encode_ordinary=self._encode_ordinary,
            vocab_rows=rows,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            stop_token_ids=self.stop_token_ids,
            chat_template=self.chat_template,
        )

    def with_vocab_rows(self, vocab_rows: int) -> Tokenizer:
        """This vocabulary for a model with ``vocab_rows`` embedding rows."""
        if vocab_rows < self.num_tokens:
            raise ValueError(
                f"{vocab_rows} rows cannot hold {self.name}'s {self.num_tokens} tokens"
            )
        if vocab_rows == self.vocab_rows:
            return self
        return Tokenizer(
            name=self.name,
            token_bytes=self._token_bytes,
            special_tokens=self.special_tokens,
            encode_ordinary=self._encode_ordinary,
            vocab_rows=vocab_rows,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            stop_token_ids=self.stop_token_ids,
            chat_template=self.chat_template,
        )

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self.name!r}, tokens={self.num_tokens}, rows={self.vocab_rows}, "
            f"specials={len(self.special_tokens)})"
        )
