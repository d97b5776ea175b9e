"""``thinkgate make-model DIR``: a small causal LM with random weights, as a Hugging Face
model directory, for a real forward pass without a download.

The directory holds what a real model's does: ``config.json`` and seeded random weights
(``model.safetensors``) of a Qwen3-like or Llama-like architecture,
``generation_config.json`` (the stop tokens), the tokenizer files of a bundled
vocabulary (``tokenizer.json``, ``tokenizer_config.json``) and its chat template. The
model writes nonsense, but it is a real transformer of the chosen size over the real
vocabulary: its forward pass costs what such a model costs, and every token it writes
goes through the engine's grammar and reasoning paths like a trained model's would.

    thinkgate make-model /tmp/tiny --arch qwen3 --layers 2 --hidden 64
    thinkgate demo --model /tmp/tiny
    thinkgate serve --model /tmp/tiny
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ARCHS = ("qwen3", "llama")


def model_config(
    arch: str,
    *,
    layers: int,
    hidden: int,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    vocab: str = "qwen3",
):
    """The transformers config of a model of this shape over the bundled ``vocab``."""
    from transformers import LlamaConfig, Qwen3Config

    from tokenization import BUNDLED, load_bundled

    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}: use one of {', '.join(ARCHS)}")
    if layers < 1 or hidden < 8:
        raise ValueError("need at least 1 layer and a hidden size of at least 8")
    heads = heads or max(2, hidden // 32)
    kv_heads = kv_heads or max(1, heads // 2)
    if hidden % heads or heads % kv_heads:
        raise ValueError(
            f"the hidden size ({hidden}) must divide into {heads} heads, and the heads into "
            f"{kv_heads} key-value heads"
        )
    tok = load_bundled(vocab)
    spec = BUNDLED[vocab]
    common = dict(
        vocab_size=tok.vocab_rows,
        hidden_size=hidden,
        intermediate_size=intermediate or 3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.special_tokens[spec.stops[-1]],
    )
    if arch == "qwen3":
        return Qwen3Config(**common, rope_theta=1_000_000.0)
    return LlamaConfig(**common, rope_theta=500_000.0)


def make_model(
    directory: str | Path,
    *,
    arch: str = "qwen3",
    layers: int = 2,
    hidden: int = 64,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    vocab: str = "qwen3",
    seed: int = 0,
    tokenizer_files: bool = True,
) -> Path:
    """Write the model directory; returns its path. The weights depend only on the
    shape and ``seed``. Without ``tokenizer_files`` only the model is written (load it
    with the bundled vocabulary as the tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from tokenization import BUNDLED, load_bundled

    root = Path(directory)
    config = model_config(
        arch,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=vocab,
    )
    root.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(root)
    tok = load_bundled(vocab)
    stops = [tok.special_tokens[s] for s in BUNDLED[vocab].stops]
    (root / "generation_config.json").write_text(
        json.dumps({"eos_token_id": stops, "bos_token_id": tok.bos_token_id}, indent=1),
        encoding="utf-8",
    )
    if tokenizer_files:
        from frontend.chat_template import BUILTIN_TEMPLATES, builtin_template
        from tokenization.hf_export import write_hf_tokenizer

        template = builtin_template(vocab) if vocab in BUILTIN_TEMPLATES else None
        write_hf_tokenizer(vocab, root, chat_template=template)
    return root


def main(argv: list[str] | None = None) -> int:
    from tokenization.hf_export import EXPORTABLE

    doc = __doc__ or ""
    ap = argparse.ArgumentParser(
        prog="thinkgate make-model",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 2)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("directory", metavar="DIR", help="where to write the model")
    ap.add_argument("--arch", choices=ARCHS, default="qwen3", help="default qwen3")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    ap.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    ap.add_argument("--heads", type=int, help="attention heads (default hidden/32, at least 2)")
    ap.add_argument("--kv-heads", type=int, help="key-value heads (default heads/2)")
    ap.add_argument("--intermediate", type=int, help="MLP size (default 3 x hidden)")
    ap.add_argument(
        "--vocab", choices=sorted(EXPORTABLE), default="qwen3", help="bundled vocabulary"
    )
    ap.add_argument("--seed", type=int, default=0, help="of the random weights (default 0)")
    args = ap.parse_args(argv)
    try:
        root = make_model(
            args.directory,
            arch=args.arch,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            intermediate=args.intermediate,
            vocab=args.vocab,
            seed=args.seed,
        )
    except ValueError as e:
        ap.error(str(e))
    size = sum(f.stat().st_size for f in root.iterdir() if f.is_file())
    shape = f"{args.arch}, {args.layers} layers, hidden {args.hidden}"
    print(f"wrote {root} ({shape}, {size >> 20} MiB)")
    return 0
