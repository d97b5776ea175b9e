"""Tokenizers read from a local Hugging Face model directory.

Reads ``tokenizer.json`` with the ``tokenizers`` library and ``tokenizer_config.json``
(added tokens, eos, the chat template); ``config.json`` gives the model's vocabulary
rows and ``generation_config.json`` its stop ids. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .tokenizer import Tokenizer


def _byte_decoder() -> dict[str, int]:
    """The inverse of the byte-to-unicode table of byte-level BPE."""
    kept = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(0xA1, 0xAC + 1))
        + list(range(0xAE, 0xFF + 1))
    )
    table = {chr(b): b for b in kept}
    shifted = 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _decoder_kind(tokenizer_json: dict[str, Any]) -> str:
    """'byte_level', 'byte_fallback' or 'raw', from the decoder and model sections."""
    text = json.dumps(tokenizer_json.get("decoder") or {})
    model = tokenizer_json.get("model") or {}
    if '"ByteLevel"' in text:
        return "byte_level"
    if model.get("byte_fallback") or '"ByteFallback"' in text or '"Metaspace"' in text:
        return "byte_fallback"
    return "raw"


def load_hf_directory(path: str | Path) -> Tokenizer:
    """The tokenizer of the model directory ``path``."""
    root = Path(path)
    tj_path = root / "tokenizer.json"
    if not root.is_dir():
        raise FileNotFoundError(f"tokenizer directory {str(root)!r} does not exist")
    if not tj_path.is_file():
        raise FileNotFoundError(f"{str(tj_path)!r} is missing: a tokenizer.json is required")

    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(tj_path))
    tj = _read_json(tj_path)
    config = _read_json(root / "tokenizer_config.json")
    model_config = _read_json(root / "config.json")
    gen_config = _read_json(root / "generation_config.json")

    vocab = hf.get_vocab(with_added_tokens=True)
    added: dict[str, int] = {a["content"]: a["id"] for a in tj.get("added_tokens") or []}
    for tid, entry in (config.get("added_tokens_decoder") or {}).items():
        if isinstance(entry, dict) and isinstance(entry.get("content"), str):
            added[entry["content"]] = int(tid)

    kind = _decoder_kind(tj)
    byte_dec = _byte_decoder() if kind == "byte_level" else None
    n = max(vocab.values()) + 1 if vocab else 0
    token_bytes = [b""] * n
    for text, tid in vocab.items():
        if text in added:
            token_bytes[tid] = text.encode("utf-8")
        elif byte_dec is not None:
            token_bytes[tid] = bytes(byte_dec.get(ch, 0x3F) for ch in text)
        elif kind == "byte_fallback":
            if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                token_bytes[tid] = bytes([int(text[3:5], 16)])
            else:
                token_bytes[tid] = text.replace("\u2581", " ").encode("utf-8")
        else:
            token_bytes[tid] = text.encode("utf-8")

    def encode_ordinary(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False).ids)

    eos_text = _token_text(config.get("eos_token"))
    bos_text = _token_text(config.get("bos_token"))
    eos_id = added.get(eos_text) if eos_text else None
    if eos_id is None and eos_text:
        eos_id = vocab.get(eos_text)
    bos_id = (added.get(bos_text) or vocab.get(bos_text)) if bos_text else None
    stops: list[int] = []
    gen_eos = gen_config.get("eos_token_id", model_config.get("eos_token_id"))
    if isinstance(gen_eos, int):
        stops.append(gen_eos)
    elif isinstance(gen_eos, list):
        stops.extend(int(x) for x in gen_eos)
    if eos_id is None and stops:
        eos_id = stops[0]

    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja_file = root / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")

    rows = model_config.get("vocab_size")
    return Tokenizer(
        name=str(root),
        token_bytes=token_bytes,
        special_tokens=added,
        encode_ordinary=encode_ordinary,
        vocab_rows=int(rows) if isinstance(rows, int) else None,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        stop_token_ids=stops,
        chat_template=template if isinstance(template, str) else None,
    )
