"""Tokenizers shared by the front end and the engine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .bundled import BUNDLED, load_bundled
from .detokenizer import IncrementalDetokenizer
from .hf import load_hf_directory
from .tokenizer import Tokenizer


def load_tokenizer(name_or_path: str, extra_special_tokens: Sequence[str] = ()) -> Tokenizer:
    """A bundled vocabulary by name (``qwen3``, ``llama3``, ``o200k_harmony``,
    ``cl100k_base``) or a local Hugging Face directory by path, with optional extra
    special tokens appended (for families whose vocabulary is not bundled)."""
    if name_or_path in BUNDLED:
        tok = load_bundled(name_or_path)
    elif Path(name_or_path).exists():
        tok = load_hf_directory(name_or_path)
    else:
        raise FileNotFoundError(
            f"tokenizer {name_or_path!r} is neither a bundled vocabulary "
            f"({', '.join(sorted(BUNDLED))}) nor an existing directory"
        )
    return tok.with_special_tokens(extra_special_tokens) if extra_special_tokens else tok


__all__ = [
    "BUNDLED",
    "IncrementalDetokenizer",
    "Tokenizer",
    "load_bundled",
    "load_hf_directory",
    "load_tokenizer",
]
