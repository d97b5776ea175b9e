"""Prompts built from the tokenizer, never typed in as token ids."""

from __future__ import annotations

import functools

from tokenization import load_tokenizer


@functools.cache
def _chat_prompt(text: str, vocab: str) -> tuple[int, ...]:
    turn = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return tuple(load_tokenizer(vocab).encode(turn))


def chat_prompt(text: str = "hi", vocab: str = "qwen3") -> list[int]:
    """One user turn and the opened assistant turn in the ChatML form of the Qwen3
    vocabulary (``<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n``)."""
    return list(_chat_prompt(text, vocab))
