"""The engine-level side of structured outputs: compile service, reasoning parsers per
kwargs, request guides, and the bitmask filler."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from reasoning import ParserCache, ReasoningParser

from .bitmask import BitmaskFiller, FilledMask, fill_threads_for
from .compile_service import CompileService
from .config import StructuredOutputConfig
from .guard import GuardedMatcher, GuardTable
from .guide import RequestGuide
from .specs import CompileOptions, GrammarSpec
from .string_masks import kept_for
from .structural_tags import require_marker_binding
from .vocab import tokenizer_info_for

if TYPE_CHECKING:
    import xgrammar as xgr

    from tokenization import Tokenizer

T = TypeVar("T")
log = logging.getLogger(__name__)


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
        require_marker_binding()  # an xgrammar without it would leave markers as text
        if reasoning_parser is not None:
            self.parser_for(None)  # a parser that cannot serve this vocabulary stops start-up
        # Built in the background (start-up answers its handshake meanwhile); the first
        # grammar to load, and the first guide, wait for them.
        self._tokenizer_info = _in_background(
            "xgrammar TokenizerInfo", lambda: tokenizer_info_for(tokenizer)
        )
        self.compiler = CompileService(
            tokenizer,
            self.options,
            self._tokenizer_info,
            num_workers=config.compile_workers,
            timeout_s=config.compile_timeout_s,
            cache_bytes=config.grammar_cache_mb << 20,
            worker_memory_bytes=config.compile_worker_memory_mb << 20,
            max_compiled_bytes=config.max_compiled_grammar_mb << 20,
            prepare=self._prepare,
        )
        self._guard: Future[GuardTable] = _in_background(
            "guard table",
            lambda: GuardTable(
                tokenizer.all_token_bytes,
                tokenizer.vocab_rows,
                special_ids=tokenizer.special_ids,
                limit=config.max_whitespace,
            ),
        )
        try:
            self.filler = BitmaskFiller(
                max_num_seqs,
                tokenizer.vocab_rows,
                pin_memory=pin_memory,
                num_buffers=2 if pin_memory else 1,
                batch_threshold=config.fill_batch_threshold,
                max_threads=fill_threads_for(config.fill_threads),
            )
        except BaseException:
            self.compiler.close()  # its workers, started already
            raise

    def _prepare(self, grammar: xgr.CompiledGrammar) -> None:
        """On the compile thread, for each newly compiled grammar: the tables its
        matchers keep string masks with (`string_masks.KeptStrings.warm`)."""
        kept_for(grammar, self._guard.result().plain).warm()

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
        parser = self.parser_for(reasoning_kwargs) if reasoning_ended is not None else None
        tracker = parser.tracker(prompt_token_ids, reasoning_ended) if parser is not None else None
        matcher = None
        if grammar is not None:
            matcher = GuardedMatcher(
                grammar,
                self.guard,
                json_text=getattr(grammar, "json_text", False),
                override_stop_tokens=stop_token_ids,
            )
        if tracker is None and matcher is None:
            return None
        guide = RequestGuide(
            tracker,
            matcher,
            implicit_end_ids=parser.implicit_end_ids if parser is not None else (),
            stop_token_ids=stop_token_ids,
            budget=reasoning_budget,
            token_ids=getattr(grammar, "token_ids", None),
        )
        self._guides.add(guide)
        return guide

    @property
    def tokenizer_info(self) -> xgr.TokenizerInfo:
        return self._tokenizer_info.result()

    @property
    def guard(self) -> GuardTable:
        """The guard table (`guard.py`), built in the background at start-up; the first
        request with a grammar waits for it."""
        table = self._guard.result()
        if self.filler.guard is None:
            self.filler.guard = table
        return table

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
        self.filler.close()


def _in_background(name: str, build: Callable[[], T]) -> Future[T]:
    """``build()`` on a daemon thread; its result, or the error it raised, in a future.
    How long it took is logged."""
    future: Future[T] = Future()

    def run() -> None:
        t0 = time.perf_counter()
        try:
            future.set_result(build())
        except BaseException as e:  # handed to whoever waits for the result
            log.error("%s failed: %s", name, e)
            future.set_exception(e)
        else:
            log.info("%s ready in %.2f s (in the background)", name, time.perf_counter() - t0)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
