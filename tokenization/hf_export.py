"""Hugging Face tokenizer files for a bundled vocabulary, so that a model directory
built here (``thinkgate make-model``) carries the real tokenizer of its vocabulary.

The bundled vocabularies are byte-level BPE given as ranks (a token's id is its rank),
as tiktoken keeps them; ``tokenizer.json`` wants merges. transformers' tiktoken
converter rebuilds the merges from the ranks; it is given the ranks from the bundled
vocabulary (quicktok's format is not tiktoken's file), the vocabulary's own split
pattern, and its special tokens at their own ids. The result encodes exactly as the
bundled tokenizer does (checked by the tests on varied text).
"""

from __future__ import annotations

import json
from pathlib import Path

from .bundled import BUNDLED, load_bundled
from .tokenizer import Tokenizer

# The pre-tokenizer splits of the vocabularies (as their model repositories ship them).
_QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: vocabulary -> (split pattern, NFC-normalised input)
EXPORTABLE: dict[str, tuple[str, bool]] = {"qwen3": (_QWEN, True), "llama3": (_LLAMA3, False)}


def hf_tokenizer_json(name: str) -> str:
    """``tokenizer.json`` (text) of the bundled vocabulary ``name``."""
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    if name not in EXPORTABLE:
        raise ValueError(
            f"no tokenizer files can be written for {name!r}; "
            f"exportable: {', '.join(sorted(EXPORTABLE))}"
        )
    tok = load_bundled(name)
    pattern, nfc = EXPORTABLE[name]
    specials = sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
    ranks = {b: i for i, b in enumerate(tok.all_token_bytes) if b and i not in tok.special_ids}
    if len(ranks) != specials[0][1]:
        raise ValueError(f"{name}: ordinary tokens must fill the ids below the special ones")

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(_: str) -> dict[bytes, int]:
            return ranks

    hf = _Converter(
        vocab_file=name, pattern=pattern, extra_special_tokens=[t for t, _ in specials]
    ).converted()
    if nfc:
        hf.normalizer = normalizers.NFC()
    wrong = [t for t, i in specials if hf.token_to_id(t) != i]
    if wrong:
        raise ValueError(f"{name}: special tokens landed on other ids: {wrong[:5]}")
    return hf.to_str()


def write_hf_tokenizer(
    name: str, directory: str | Path, *, chat_template: str | None = None
) -> Tokenizer:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` (and ``chat_template.jinja``
    when given) of the bundled vocabulary ``name`` into ``directory``; returns the
    bundled tokenizer they describe."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tok = load_bundled(name)
    spec = BUNDLED[name]
    (root / "tokenizer.json").write_text(hf_tokenizer_json(name), encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": spec.eos,
        "bos_token": spec.bos,
        "pad_token": spec.stops[-1],
        "model_max_length": 131072,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True}
            for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
        },
    }
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    if chat_template is not None:
        (root / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return tok
