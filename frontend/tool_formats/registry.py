"""Names (the values of ``--tool-call-parser``) to tool-call formats, imported on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import ToolFormat

if TYPE_CHECKING:
    from tokenization import Tokenizer

# name -> "module:Class"; a format's name appears here and nowhere else.
_LAZY: dict[str, str] = {
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
}
_LOADED: dict[str, type[ToolFormat]] = {}


def register_tool_format(name: str) -> Callable[[type[ToolFormat]], type[ToolFormat]]:
    """Class decorator: make a format available under ``name`` (plugins use this)."""

    def deco(cls: type[ToolFormat]) -> type[ToolFormat]:
        if not (isinstance(cls, type) and issubclass(cls, ToolFormat)):
            raise TypeError(f"{cls!r} is not a ToolFormat subclass")
        cls.name = name
        _LOADED[name] = cls
        return cls

    return deco


def tool_format_names() -> list[str]:
    return sorted(set(_LAZY) | set(_LOADED))


def get_tool_format_class(name: str) -> type[ToolFormat]:
    cls = _LOADED.get(name)
    if cls is not None:
        return cls
    target = _LAZY.get(name)
    if target is None:
        raise KeyError(
            f"unknown tool-call parser {name!r}; known: {', '.join(tool_format_names())}"
        )
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    cls.name = name
    _LOADED[name] = cls
    return cls


def create_tool_format(name: str, tokenizer: Tokenizer) -> ToolFormat:
    return get_tool_format_class(name)(tokenizer)
