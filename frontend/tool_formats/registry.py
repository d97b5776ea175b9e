"""Names (the values of ``--tool-call-parser``) to tool-call formats, imported on first use."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from registry import Registry

from .base import ToolFormat

if TYPE_CHECKING:
    from tokenization import Tokenizer

# A format's name appears here and nowhere else.
TOOL_FORMATS: Registry[ToolFormat] = Registry(
    "tool-call parser",
    ToolFormat,
    {
        "hermes": "frontend.tool_formats.hermes:HermesToolFormat",
        "qwen3_coder": "frontend.tool_formats.qwen3_coder:Qwen3CoderToolFormat",
        "llama3_json": "frontend.tool_formats.llama3_json:Llama3JsonToolFormat",
        "mistral": "frontend.tool_formats.mistral:MistralToolFormat",
        "deepseek_v3": "frontend.tool_formats.deepseek_v3:DeepSeekV3ToolFormat",
        "deepseek_v31": "frontend.tool_formats.deepseek_v31:DeepSeekV31ToolFormat",
        "kimi_k2": "frontend.tool_formats.kimi_k2:KimiK2ToolFormat",
        "glm45": "frontend.tool_formats.glm45:Glm45ToolFormat",
        "minimax_m2": "frontend.tool_formats.minimax_m2:MiniMaxM2ToolFormat",
        "pythonic": "frontend.tool_formats.pythonic:PythonicToolFormat",
        "openai": "frontend.tool_formats.openai:HarmonyToolFormat",
    },
)


def register_tool_format(name: str) -> Callable[[type[ToolFormat]], type[ToolFormat]]:
    """Class decorator: make a format available under ``name`` (plugins use this)."""
    return TOOL_FORMATS.register(name)


def tool_format_names() -> list[str]:
    return TOOL_FORMATS.names()


def get_tool_format_class(name: str) -> type[ToolFormat]:
    """The class registered as ``name``; an unknown name lists the known ones
    (`registry.UnknownNameError`, a `KeyError`)."""
    return TOOL_FORMATS.get(name)


def create_tool_format(name: str, tokenizer: Tokenizer) -> ToolFormat:
    """An instance of format ``name`` on ``tokenizer``; its errors name it ``name``."""
    return TOOL_FORMATS.create(name, tokenizer)
