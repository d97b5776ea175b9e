"""The engine-level side of structured outputs: compile service, reasoning parsers per
kwargs, request guides, and the bitmask filler."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reasoning import ParserCache, ReasoningParser

from .bitmask import BitmaskFiller, FilledMask
from .compile_service import CompileService
from .guide import RequestGuide
from .specs import CompileOptions, GrammarSpec
from .vocab import tokenizer_info_for

if TYPE_CHECKING:
    import xgrammar as xgr

    from tokenization import Tokenizer


@dataclass(frozen=True, slots=True)
class StructuredOutputConfig:
    max_whitespace: int = 16
    max_spec_bytes: int = 1 << 20
    compile_workers: int = 2
    compile_timeout_s: float = 10.0
    cache_bytes: int = 512 << 20
    worker_memory_bytes: int = 8 << 30
    #: a compiled grammar larger than this (serialized, as it travels from its worker)
    #: is refused: loading it costs the engine several times as much
    max_compiled_bytes: int = 256 << 20
    fill_batch_threshold: int = 64
    fill_threads: int = 2


class StructuredOutputManager:
    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        reasoning_parser: str | None,
        max_num_seqs: int,
        config: StructuredOutputConfig,
        pin_memory: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.reasoning_parser_name = reasoning_parser
        self.config = config
        self.options = CompileOptions(
            max_whitespace=config.max_whitespace, max_spec_bytes=config.max_spec_bytes
        )
        self._parsers = (
            ParserCache(reasoning_parser, tokenizer, field="reasoning_parser_kwargs")
            if reasoning_parser is not None
            else None
        )
        self._guides: weakref.WeakSet[RequestGuide] = weakref.WeakSet()
        if reasoning_parser is not None:
            self.parser_for(None)  # a parser that cannot serve this vocabulary stops start-up
        self.tokenizer_info = tokenizer_info_for(tokenizer)
        self.compiler = CompileService(
            tokenizer,
            self.options,
            self.tokenizer_info,
            num_workers=config.compile_workers,
            timeout_s=config.compile_timeout_s,
            cache_bytes=config.cache_bytes,
            worker_memory_bytes=config.worker_memory_bytes,
            max_compiled_bytes=config.max_compiled_bytes,
        )
        self.filler = BitmaskFiller(
            max_num_seqs,
            tokenizer.vocab_rows,
            pin_memory=pin_memory,
            num_buffers=2 if pin_memory else 1,
            batch_threshold=config.fill_batch_threshold,
            max_threads=config.fill_threads,
        )

    def parser_for(self, kwargs: Mapping[str, Any] | None) -> ReasoningParser | None:
        """The engine's reasoning parser built with a request's chat-template kwargs,
        from the same kind of cache the front end builds its own from
        (`reasoning.ParserCache`); raises `ReasoningError` for kwargs it cannot use."""
        return self._parsers.get(kwargs) if self._parsers is not None else None

    def submit(self, spec: GrammarSpec) -> Future[xgr.CompiledGrammar]:
        return self.compiler.submit(spec)

    def release(self, spec: GrammarSpec, future: Future[xgr.CompiledGrammar]) -> None:
        """The request that submitted ``spec`` ended before using its grammar."""
        self.compiler.release(spec, future)

    def make_guide(
        self,
        grammar: xgr.CompiledGrammar | None,
        *,
        prompt_token_ids: Sequence[int],
        reasoning_ended: bool | None,
        reasoning_kwargs: Mapping[str, Any] | None,
        reasoning_budget: int | None,
        stop_token_ids: Sequence[int],
    ) -> RequestGuide | None:
        """The guide of one request, or None when it needs none (no grammar, and no
        reasoning to track)."""
        import xgrammar as xgr

        parser = self.parser_for(reasoning_kwargs) if reasoning_ended is not None else None
        tracker = parser.tracker(prompt_token_ids, reasoning_ended) if parser is not None else None
        matcher = (
            xgr.GrammarMatcher(grammar, override_stop_tokens=list(stop_token_ids))
            if grammar is not None
            else None
        )
        if tracker is None and matcher is None:
            return None
        guide = RequestGuide(
            tracker,
            matcher,
            implicit_end_ids=parser.implicit_end_ids if parser is not None else (),
            stop_token_ids=stop_token_ids,
            budget=reasoning_budget,
        )
        self._guides.add(guide)
        return guide

    @property
    def num_guides(self) -> int:
        """Guides still alive (anything still holding one keeps it counted)."""
        return len(self._guides)

    @property
    def num_compiling(self) -> int:
        return self.compiler.num_pending

    @property
    def num_cached_grammars(self) -> int:
        return len(self.compiler.cache)

    def fill(self, rows: Sequence[int], guides: Sequence[RequestGuide]) -> FilledMask:
        return self.filler.fill(rows, guides)

    def close(self) -> None:
        self.compiler.close()
