"""A tiny randomly initialised causal LM with a real (trained here) byte-level BPE
tokenizer, saved as a Hugging Face model directory. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
]

CORPUS = [
    'The weather in Paris is {"city": "Paris", "unit": "celsius"} today.',
    "Let me think about this step by step: first, then, finally.",
    '{"name": "get_weather", "arguments": {"city": "Berlin", "days": 3}}',
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 42 3.14 and true false null [] {}",
    "Über café naïve résumé 東京 — quotes \"a\" and 'b'.",
] * 20

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_model(root: Path, *, seed: int = 0) -> Path:
    """Write tokenizer.json, tokenizer_config.json, config.json and weights under
    ``root``; returns ``root``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    root.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(root / "tokenizer.json"))
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    rows = -(-vocab_size // 64) * 64
    (root / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|im_end|>",
                "bos_token": None,
                "chat_template": TEMPLATE,
                "added_tokens_decoder": {
                    str(tok.token_to_id(s)): {"content": s, "special": True} for s in SPECIALS
                },
            }
        )
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=rows,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tok.token_to_id("<|im_end|>"),
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(root)
    (root / "generation_config.json").write_text(
        json.dumps(
            {
                "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
            }
        )
    )
    return root


# ----- models over a real vocabulary, as `thinkgate make-model` writes them -------------

#: the architectures the batched runner is checked on
ARCHS = ("qwen3", "llama")


def build_model(root: Path, arch: str = "qwen3", *, hidden: int = 32, seed: int = 0) -> Path:
    """A 2-layer model of ``arch`` over the qwen3 vocabulary (151,936 rows), random
    weights from ``seed``; no tokenizer files (load it with the bundled ``qwen3``)."""
    from thinkgate.make_model import make_model

    return make_model(
        root, arch=arch, layers=2, hidden=hidden, heads=4, seed=seed, tokenizer_files=False
    )


def reference_generate(
    model,
    prompt: list[int],
    max_new_tokens: int,
    *,
    stop_ids: list[int] | None = None,
    logits_processor=None,
) -> list[int]:
    """Greedy tokens of transformers' own ``generate``, one sequence alone: exactly
    ``max_new_tokens`` without ``stop_ids``, else up to and with the first stop."""
    import torch

    kwargs = {}
    if logits_processor is not None:
        from transformers import LogitsProcessorList

        kwargs["logits_processor"] = LogitsProcessorList([logits_processor])
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0 if stop_ids else max_new_tokens,
            do_sample=False,
            eos_token_id=stop_ids,
            pad_token_id=0,
            **kwargs,
        )
    return out[0, len(prompt) :].tolist()


def load_reference(path: Path, dtype: str = "float64"):
    """The model at ``path`` as transformers loads it by default (its own attention)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=getattr(torch, dtype)
    )
    return model.eval()
