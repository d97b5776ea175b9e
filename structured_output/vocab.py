"""xgrammar's view of our vocabulary.

Special tokens are *sealed*: xgrammar sees each one's text behind a NUL byte
(``b"\\x00<tool_call>"``). Text that a grammar generates (a JSON string, a number,
a regex's characters) cannot contain a NUL, so no special token can ever appear
inside it, spelled as text; a special token is produced only where a grammar asks
for that very token (a structural tag's ``{"type": "token"}``). This is what keeps a
family's markers out of argument strings, at no compile cost (xgrammar's own
``excludes`` multiply compile times by 10 to 20), and what forces each marker as its
single token rather than as several ordinary ones. Structural tags that name markers
by their text are rewritten to token ids before compiling (`structural_tags.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import xgrammar as xgr

    from tokenization import Tokenizer

#: the byte in front of every special token's text, as xgrammar sees it
SEAL = b"\x00"


def build_tokenizer_info(
    token_bytes: Sequence[bytes],
    vocab_rows: int,
    stop_token_ids: Sequence[int],
    special_ids: Collection[int] = (),
) -> xgr.TokenizerInfo:
    """A RAW-vocabulary `TokenizerInfo` padded to the model's ``vocab_rows``, with the
    special tokens ``special_ids`` sealed."""
    import xgrammar as xgr

    vocab = list(token_bytes)
    for tid in special_ids:
        if vocab[tid]:
            vocab[tid] = SEAL + vocab[tid]
    return xgr.TokenizerInfo(
        vocab,
        xgr.VocabType.RAW,
        vocab_size=vocab_rows,
        stop_token_ids=list(stop_token_ids),
    )


def tokenizer_info_for(tokenizer: Tokenizer) -> xgr.TokenizerInfo:
    return build_tokenizer_info(
        tokenizer.all_token_bytes,
        tokenizer.vocab_rows,
        tokenizer.stop_token_ids,
        tokenizer.special_ids,
    )


def pack_ids(flags: np.ndarray, words: int) -> np.ndarray:
    """bool ``[N]`` (one per token id) -> uint32 ``[words]``, bit ``t % 32`` of word
    ``t // 32`` for id ``t``: the bits of the true ids alone."""
    import numpy as np  # not at import: the CLI's help imports this module

    padded = np.zeros(words * 32, dtype=bool)
    padded[: len(flags)] = flags
    return np.packbits(padded, bitorder="little").view(np.uint32)
