"""Compiling in this process, for tests and benchmarks (the engine compiles through
`compile_service.py`: in worker processes, or in itself with ``--compile-workers 0``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .specs import CompileOptions, GrammarSpec, compile_constraint
from .vocab import tokenizer_info_for

if TYPE_CHECKING:
    import xgrammar as xgr

    from tokenization import Tokenizer

    from .guard import GuardedGrammar, GuardedMatcher, GuardTable


class LocalCompiler:
    """Specs of one vocabulary, compiled exactly as the engine compiles them, and
    matchers guarded as the engine guards them (`guard.py`)."""

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
        self._guard: GuardTable | None = None

    @property
    def guard(self) -> GuardTable:
        """The guard of this vocabulary and whitespace bound (built on first use)."""
        if self._guard is None:
            from .guard import GuardTable

            tok = self.tokenizer
            self._guard = GuardTable(
                tok.all_token_bytes,
                tok.vocab_rows,
                special_ids=tok.special_ids,
                limit=self.options.max_whitespace,
            )
        return self._guard

    def compile(self, spec: GrammarSpec) -> GuardedGrammar:
        from .guard import GuardedGrammar

        grammar, json_text = compile_constraint(
            self.compiler, spec, self.options, self.tokenizer.special_tokens
        )
        return GuardedGrammar.wrap(grammar, json_text)

    def matcher(
        self,
        spec_or_grammar: GrammarSpec | xgr.CompiledGrammar,
        stop_token_ids: Sequence[int] | None = None,
    ) -> GuardedMatcher:
        """A guarded matcher that ends on ``stop_token_ids`` (default: the
        vocabulary's). A grammar compiled elsewhere (not a `GuardedGrammar`) is matched
        as raw text."""
        from .guard import GuardedMatcher

        grammar = (
            self.compile(spec_or_grammar)
            if isinstance(spec_or_grammar, GrammarSpec)
            else spec_or_grammar
        )
        stops = list(self.tokenizer.stop_token_ids if stop_token_ids is None else stop_token_ids)
        return GuardedMatcher(
            grammar,
            self.guard,
            json_text=getattr(grammar, "json_text", False),
            override_stop_tokens=stops,
        )
