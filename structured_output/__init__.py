"""Grammars for structured outputs: compile, gate on the end of thinking, fill, apply."""

from .local import LocalCompiler
from .specs import CompileOptions, GrammarError, GrammarSpec, SpecKind, compile_spec
from .vocab import build_tokenizer_info, tokenizer_info_for

__all__ = [
    "CompileOptions",
    "GrammarError",
    "GrammarSpec",
    "LocalCompiler",
    "SpecKind",
    "build_tokenizer_info",
    "compile_spec",
    "tokenizer_info_for",
]
