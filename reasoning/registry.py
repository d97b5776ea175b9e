"""Names (the values of ``--reasoning-parser``) to parser classes, imported on first use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from registry import Registry, load_plugin

from .base import ReasoningParser

if TYPE_CHECKING:
    from tokenization import Tokenizer

# A parser's name appears here and nowhere else.
REASONING_PARSERS: Registry[ReasoningParser] = Registry(
    "reasoning parser",
    ReasoningParser,
    {
        "qwen3": "reasoning.qwen3:Qwen3ReasoningParser",
        "deepseek_r1": "reasoning.deepseek_r1:DeepSeekR1ReasoningParser",
        "deepseek_v3": "reasoning.deepseek_v3:DeepSeekV3ReasoningParser",
        "glm45": "reasoning.glm45:Glm45ReasoningParser",
        "kimi_k2": "reasoning.kimi_k2:KimiK2ReasoningParser",
        "minimax_m2": "reasoning.minimax_m2:MiniMaxM2ReasoningParser",
        "seed_oss": "reasoning.seed_oss:SeedOssReasoningParser",
        "mistral": "reasoning.mistral:MistralReasoningParser",
        "granite": "reasoning.granite:GraniteReasoningParser",
        "hunyuan_a13b": "reasoning.hunyuan_a13b:HunyuanA13BReasoningParser",
        "ernie45": "reasoning.ernie45:Ernie45ReasoningParser",
        "olmo3": "reasoning.olmo3:Olmo3ReasoningParser",
        "cohere_command": "reasoning.cohere_command:CohereCommandReasoningParser",
        "openai_gptoss": "reasoning.openai_gptoss:GptOssReasoningParser",
    },
)


def register_reasoning_parser(
    name: str,
) -> Callable[[type[ReasoningParser]], type[ReasoningParser]]:
    """Class decorator: make a parser available under ``name`` (plugins use this)."""
    return REASONING_PARSERS.register(name)


def reasoning_parser_names() -> list[str]:
    return REASONING_PARSERS.names()


def get_reasoning_parser_class(name: str) -> type[ReasoningParser]:
    """The class registered as ``name``; an unknown name lists the known ones
    (`registry.UnknownNameError`, a `KeyError`)."""
    return REASONING_PARSERS.get(name)


def create_reasoning_parser(
    name: str, tokenizer: Tokenizer, chat_template_kwargs: Mapping[str, Any] | None = None
) -> ReasoningParser:
    """An instance of parser ``name``, validated against ``tokenizer``; its errors name
    it ``name``."""
    return REASONING_PARSERS.create(name, tokenizer, chat_template_kwargs)


__all__ = [
    "REASONING_PARSERS",
    "create_reasoning_parser",
    "get_reasoning_parser_class",
    "load_plugin",
    "reasoning_parser_names",
    "register_reasoning_parser",
]
