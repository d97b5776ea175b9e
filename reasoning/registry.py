"""Names (the values of ``--reasoning-parser``) to parser classes, imported on first use."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import ReasoningParser

if TYPE_CHECKING:
    from tokenization import Tokenizer

# name -> "module:Class"; a parser's name appears here and nowhere else.
_LAZY: dict[str, str] = {
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
}
_LOADED: dict[str, type[ReasoningParser]] = {}


def register_reasoning_parser(
    name: str,
) -> Callable[[type[ReasoningParser]], type[ReasoningParser]]:
    """Class decorator: make a parser available under ``name`` (plugins use this)."""

    def deco(cls: type[ReasoningParser]) -> type[ReasoningParser]:
        if not (isinstance(cls, type) and issubclass(cls, ReasoningParser)):
            raise TypeError(f"{cls!r} is not a ReasoningParser subclass")
        cls.name = name
        _LOADED[name] = cls
        return cls

    return deco


def reasoning_parser_names() -> list[str]:
    return sorted(set(_LAZY) | set(_LOADED))


def get_reasoning_parser_class(name: str) -> type[ReasoningParser]:
    """The class registered as ``name``; an unknown name lists the known ones."""
    cls = _LOADED.get(name)
    if cls is not None:
        return cls
    target = _LAZY.get(name)
    if target is None:
        raise KeyError(
            f"unknown reasoning parser {name!r}; known: {', '.join(reasoning_parser_names())}"
        )
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    cls.name = name
    _LOADED[name] = cls
    return cls


def create_reasoning_parser(
    name: str, tokenizer: Tokenizer, chat_template_kwargs: Mapping[str, Any] | None = None
) -> ReasoningParser:
    """An instance of parser ``name``, validated against ``tokenizer``."""
    return get_reasoning_parser_class(name)(tokenizer, chat_template_kwargs)


def load_plugin(path: str) -> None:
    """Import a module (a file path or a dotted name) that registers more parsers."""
    p = Path(path)
    if p.suffix == ".py" and p.is_file():
        mod_name = f"_thinkgate_plugin_{abs(hash(str(p.resolve())))}"
        if mod_name in sys.modules:
            return
        spec = importlib.util.spec_from_file_location(mod_name, p)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import plugin {path!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    else:
        try:
            importlib.import_module(path)
        except ImportError as e:
            raise ImportError(f"cannot import plugin {path!r}: {e}") from e
