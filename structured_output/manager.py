"""The engine-level side of structured outputs: compile service, reasoning parsers per
kwargs, request guides, and the bitmask filler."""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reasoning import ReasoningError, ReasoningParser, create_reasoning_parser

from .bitmask import BitmaskFiller, FilledMask
from .compile_service import CompileService
from .guide import RequestGuide, SeparatorTable
from .specs import CompileOptions, GrammarSpec
from .structural_tags import require_marker_binding
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
        self._parsers: OrderedDict[str, ReasoningParser] = OrderedDict()
        self._separators: dict[bytes, SeparatorTable] = {}
        self._guides: weakref.WeakSet[RequestGuide] = weakref.WeakSet()
        require_marker_binding()  # an xgrammar without it would leave markers as text
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
        """The engine's reasoning parser built with a request's chat-template kwargs
        (cached; raises the parser's error for kwargs it cannot use)."""
        if self.reasoning_parser_name is None:
            return None
        try:
            key = json.dumps(kwargs or {}, sort_keys=True, default=str)
        except (TypeError, ValueError, RecursionError) as e:
            # from the wire: a nested mapping with keys of mixed types, or nesting too deep
            raise ReasoningError(
                f"reasoning_parser_kwargs must be JSON-like, with string keys: {e}"
            ) from None
        parser = self._parsers.get(key)
        if parser is None:
            parser = create_reasoning_parser(self.reasoning_parser_name, self.tokenizer, kwargs)
            self._parsers[key] = parser
            if len(self._parsers) > 256:
                self._parsers.popitem(last=False)
        else:
            self._parsers.move_to_end(key)
        return parser

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
        separator = None
        if parser is not None and parser.content_separator:
            sep = parser.content_separator
            separator = self._separators.get(sep)
            if separator is None:
                separator = self._separators[sep] = SeparatorTable(
                    sep, self.tokenizer.all_token_bytes
                )
        guide = RequestGuide(
            tracker,
            matcher,
            separator=separator,
            implicit_end_ids=parser.implicit_end_ids if parser is not None else (),
            stop_token_ids=stop_token_ids,
            budget=reasoning_budget,
            token_bytes=self.tokenizer.all_token_bytes,
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
