"""Compiling in this process, for tests and benchmarks (the engine compiles in
worker processes: `compile_service.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .specs import CompileOptions, GrammarSpec, compile_spec
from .vocab import tokenizer_info_for

if TYPE_CHECKING:
    import xgrammar as xgr

    from tokenization import Tokenizer


class LocalCompiler:
    """Specs of one vocabulary, compiled exactly as the engine compiles them."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        options: CompileOptions | None = None,
        *,
        cache: bool = True,
        max_threads: int = 1,
    ) -> None:
        import xgrammar as xgr

        self.tokenizer = tokenizer
        self.options = options or CompileOptions()
        self.tokenizer_info = tokenizer_info_for(tokenizer)
        self.compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=max_threads, cache_enabled=cache
        )

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        return compile_spec(self.compiler, spec, self.options, self.tokenizer.special_tokens)

    def matcher(
        self,
        spec_or_grammar: GrammarSpec | xgr.CompiledGrammar,
        stop_token_ids: Sequence[int] | None = None,
    ) -> xgr.GrammarMatcher:
        """A matcher that ends on ``stop_token_ids`` (default: the vocabulary's)."""
        import xgrammar as xgr

        grammar = (
            self.compile(spec_or_grammar)
            if isinstance(spec_or_grammar, GrammarSpec)
            else spec_or_grammar
        )
        stops = list(self.tokenizer.stop_token_ids if stop_token_ids is None else stop_token_ids)
        return xgr.GrammarMatcher(grammar, override_stop_tokens=stops)
