"""xgrammar's view of our vocabulary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import xgrammar as xgr

    from tokenization import Tokenizer


def build_tokenizer_info(
    token_bytes: Sequence[bytes], vocab_rows: int, stop_token_ids: Sequence[int]
) -> xgr.TokenizerInfo:
    """A RAW-vocabulary `TokenizerInfo` padded to the model's ``vocab_rows``."""
    import xgrammar as xgr

    return xgr.TokenizerInfo(
        list(token_bytes),
        xgr.VocabType.RAW,
        vocab_size=vocab_rows,
        stop_token_ids=list(stop_token_ids),
    )


def tokenizer_info_for(tokenizer: Tokenizer) -> xgr.TokenizerInfo:
    return build_tokenizer_info(
        tokenizer.all_token_bytes, tokenizer.vocab_rows, tokenizer.stop_token_ids
    )
