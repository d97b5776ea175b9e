"""The real vocabularies that the quicktok package bundles, read offline."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .tokenizer import Tokenizer


@dataclass(frozen=True)
class _Bundled:
    encoding: str
    vocab_rows: int
    eos: str
    stops: tuple[str, ...]
    bos: str | None = None


# vocab_rows: rows of the embedding of the models that use the vocabulary.
BUNDLED: dict[str, _Bundled] = {
    "qwen3": _Bundled("qwen3", 151_936, "<|im_end|>", ("<|im_end|>", "<|endoftext|>")),
    "llama3": _Bundled(
        "llama3",
        128_256,
        "<|eot_id|>",
        ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        bos="<|begin_of_text|>",
    ),
    "o200k_harmony": _Bundled(
        "o200k_harmony", 201_088, "<|return|>", ("<|return|>", "<|call|>", "<|endoftext|>")
    ),
    "cl100k_base": _Bundled("cl100k_base", 100_277, "<|endoftext|>", ("<|endoftext|>",)),
}


def _llama31_special_names() -> dict[int, str]:
    """Llama 3.1's names for ids 128000-128255 (quicktok carries Llama 3.0's, which
    call the tool-calling tokens reserved)."""
    fixed = {
        128000: "<|begin_of_text|>",
        128001: "<|end_of_text|>",
        128002: "<|reserved_special_token_0|>",
        128003: "<|reserved_special_token_1|>",
        128004: "<|finetune_right_pad_id|>",
        128005: "<|reserved_special_token_2|>",
        128006: "<|start_header_id|>",
        128007: "<|end_header_id|>",
        128008: "<|eom_id|>",
        128009: "<|eot_id|>",
        128010: "<|python_tag|>",
    }
    for tid in range(128011, 128256):
        fixed[tid] = f"<|reserved_special_token_{tid - 128011 + 3}|>"
    return fixed


_lock = threading.Lock()
_cache: dict[str, Tokenizer] = {}


def load_bundled(name: str) -> Tokenizer:
    """The bundled vocabulary ``name`` (cached per process)."""
    if name not in BUNDLED:
        raise KeyError(
            f"unknown bundled vocabulary {name!r}; bundled: {', '.join(sorted(BUNDLED))}"
        )
    with _lock:
        tok = _cache.get(name)
        if tok is None:
            tok = _cache[name] = _build(name, BUNDLED[name])
        return tok


def _build(name: str, spec: _Bundled) -> Tokenizer:
    import quicktok

    enc = quicktok.get_encoding(spec.encoding)
    n = enc.max_token_value + 1
    token_bytes: list[bytes] = []
    specials: dict[str, int] = {}
    for tid in range(n):
        try:
            b = enc.decode_single_token_bytes(tid)
        except KeyError:
            b = b""
        token_bytes.append(b)
        if b and enc.is_special_token(tid):
            specials[b.decode("utf-8")] = tid
    if name == "llama3":
        specials = {text: tid for tid, text in _llama31_special_names().items()}
        for tid, text in _llama31_special_names().items():
            token_bytes[tid] = text.encode("utf-8")
    return Tokenizer(
        name=name,
        token_bytes=token_bytes,
        special_tokens=specials,
        encode_ordinary=enc.encode_ordinary,
        vocab_rows=spec.vocab_rows,
        eos_token_id=specials[spec.eos],
        bos_token_id=specials[spec.bos] if spec.bos else None,
        stop_token_ids=[specials[s] for s in spec.stops],
    )
