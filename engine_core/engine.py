"""The engine core: admission, one step of the batch, and finishing requests.

One step, for the running batch:

1. launch the model's forward pass on the model thread;
2. meanwhile, feed last step's tokens to each request's guide (reasoning tracker
   and grammar), and fill the bitmask rows of the requests whose grammar is active,
   in one batched call;
3. take the logits, apply the masks, sample;
4. append the tokens, finish what stopped, and report.

`EngineCore` never touches a socket: `server.py` moves messages between the sockets
and this object.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from ipc import EngineCoreOutput, EngineCoreRequest, FinishReason
from reasoning import ReasoningError
from structured_output import GrammarError, GrammarSpec
from structured_output.guide import GuideError
from structured_output.manager import StructuredOutputConfig, StructuredOutputManager

from .config import EngineConfig
from .request import EngineRequest, Status
from .runners import RunnerOptions, create_runner
from .sampler import Sampler, SamplingBatch, StepConstraints

if TYPE_CHECKING:
    import xgrammar as xgr

log = logging.getLogger(__name__)

Output = tuple[bytes, EngineCoreOutput]


class EngineCore:
    def __init__(self, config: EngineConfig, tokenizer) -> None:
        self.config = config
        self.device = config.resolved_device()
        self.runner = create_runner(
            config.model,
            tokenizer,
            RunnerOptions(
                device=self.device,
                seed=config.seed,
                max_num_seqs=config.max_num_seqs,
                forward_ms=config.forward_ms,
                closing_bias=config.closing_bias,
                ending_texts=list(config.ending_texts),
                script=config.script,
            ),
        )
        if self.runner.vocab_rows != tokenizer.vocab_rows:
            tokenizer = tokenizer.with_vocab_rows(self.runner.vocab_rows)
        self.tokenizer = tokenizer
        self.vocab_rows = tokenizer.vocab_rows
        self.so = StructuredOutputManager(
            tokenizer,
            reasoning_parser=config.reasoning_parser,
            max_num_seqs=config.max_num_seqs,
            config=StructuredOutputConfig(
                max_whitespace=config.json_max_whitespace,
                max_spec_bytes=config.max_spec_bytes,
                compile_workers=config.compile_workers,
                compile_timeout_s=config.compile_timeout_s,
                cache_bytes=config.grammar_cache_mb << 20,
                max_compiled_bytes=config.max_compiled_grammar_mb << 20,
                worker_memory_bytes=config.compile_worker_memory_mb << 20,
                fill_batch_threshold=config.fill_batch_threshold,
            ),
            pin_memory=self.device.startswith("cuda"),
        )
        self.sampler = Sampler(self.vocab_rows)
        self.model_stop_ids = tuple(tokenizer.stop_token_ids)
        self.requests: dict[tuple[bytes, str], EngineRequest] = {}
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.rng = np.random.default_rng(config.seed)
        self.num_steps = 0
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="thinkgate-model")

    # ----- requests in and out ---------------------------------------------------

    def add_request(self, client: bytes, req: EngineCoreRequest) -> list[Output]:
        """Queue a request; a request that cannot run is answered at once with an error."""
        try:
            spec = self._check(client, req)
            r = EngineRequest(
                client,
                req,
                model_stop_ids=self.model_stop_ids,
                model_seed=int(self.rng.integers(1 << 62)),
                spec=spec,
            )
        except (GrammarError, ReasoningError, ValueError) as e:
            return [(client, _final(req.request_id, FinishReason.ERROR, error=str(e)))]
        if spec is not None:
            r.grammar = self.so.submit(spec)
        self.requests[r.key] = r
        self.waiting.append(r)
        return []

    def _check(self, client: bytes, req: EngineCoreRequest) -> GrammarSpec | None:
        sp = req.sampling_params
        if (client, req.request_id) in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        held, limit = len(self.requests), self.config.max_num_seqs + self.config.max_waiting
        if held >= limit:
            raise ValueError(
                f"the engine is full: it holds {held} requests ({self.config.max_num_seqs} "
                f"running, {self.config.max_waiting} waiting at most); retry later"
            )
        if not req.prompt_token_ids:
            raise ValueError("the prompt is empty")
        if sp.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if len(req.prompt_token_ids) + sp.max_tokens > self.config.max_model_len:
            raise ValueError(
                f"prompt ({len(req.prompt_token_ids)} tokens) plus max_tokens ({sp.max_tokens}) "
                f"exceeds the engine's max_model_len of {self.config.max_model_len}"
            )
        if min(req.prompt_token_ids) < 0 or max(req.prompt_token_ids) >= self.vocab_rows:
            raise ValueError(f"prompt token ids must lie in [0, {self.vocab_rows})")
        if not sp.temperature >= 0 or not 0 < sp.top_p <= 1 or not 0 <= sp.top_k < 1 << 63:
            raise ValueError("need temperature >= 0, 0 < top_p <= 1 and 0 <= top_k < 2**63")
        if sp.seed is not None and not 0 <= sp.seed < 1 << 64:
            raise ValueError("seed must lie in [0, 2**64)")
        if not 0 <= sp.min_tokens <= sp.max_tokens:
            raise ValueError("min_tokens must lie between 0 and max_tokens")
        if any(not 0 <= t < self.vocab_rows for t in sp.stop_token_ids):
            raise ValueError(f"stop token ids must lie in [0, {self.vocab_rows})")
        if req.reasoning_budget is not None and req.reasoning_budget < 0:
            raise ValueError("reasoning_budget must be >= 0")
        if req.reasoning_ended is not None:
            self.so.parser_for(req.reasoning_parser_kwargs)  # kwargs the parser rejects
        if req.structured_output is None:
            return None
        so = req.structured_output
        return GrammarSpec.of(so.kind, so.value, so.ignore_unsupported_keywords)

    def abort(self, client: bytes, request_ids: Iterable[str]) -> list[Output]:
        out: list[Output] = []
        for rid in request_ids:
            r = self.requests.get((client, rid))
            if r is not None and r.status != Status.FINISHED:
                r.finish(FinishReason.ABORT)
                out.append((client, self._final_of(r)))
                self._forget(r)
        return out

    def drop_client(self, client: bytes) -> int:
        """Abort every request of a client that went away (nothing is sent)."""
        mine = [r for r in self.requests.values() if r.client == client]
        for r in mine:
            r.finish(FinishReason.ABORT)
            self._forget(r)
        return len(mine)

    def _forget(self, r: EngineRequest) -> None:
        # A grammar still compiling is never cancelled here: requests with the same
        # spec share its future. The compile service skips a compile that no request
        # wants any more if it has not started; one that has runs on, and is cached.
        self.requests.pop(r.key, None)
        if r.grammar is not None and r.spec is not None and not r.grammar.done():
            self.so.release(r.spec, r.grammar)

    @property
    def num_running(self) -> int:
        """Requests in the batch (an aborted one leaves it at the next step)."""
        return sum(r.status == Status.RUNNING for r in self.running)

    @property
    def num_waiting(self) -> int:
        return sum(r.status == Status.WAITING for r in self.waiting)

    @property
    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    @property
    def has_runnable(self) -> bool:
        return bool(self.running) or any(
            r.grammar is None or r.grammar.done() for r in self.waiting
        )

    # ----- scheduling -----------------------------------------------------------

    def _schedule(self, out: list[Output]) -> None:
        """Drop finished rows; admit waiting requests whose grammar is ready, first
        come first served, up to ``max_num_seqs``. A request whose grammar is still
        compiling keeps its place and lets the ones behind it pass."""
        if any(r.status == Status.FINISHED for r in self.running):
            for r in self.running:
                if r.status == Status.FINISHED:
                    self.runner.remove(r)
            self.running = [r for r in self.running if r.status != Status.FINISHED]
        room = self.config.max_num_seqs - len(self.running)
        if not self.waiting or room <= 0:
            return
        still: deque[EngineRequest] = deque()
        waiting = self.waiting
        while waiting and room > 0:
            r = waiting.popleft()
            if r.status == Status.FINISHED:
                continue
            if r.grammar is not None and not r.grammar.done():
                still.append(r)
                continue
            try:
                compiled = _grammar_of(r.grammar)
                r.guide = self.so.make_guide(
                    compiled,
                    prompt_token_ids=r.prompt_token_ids,
                    reasoning_ended=r.reasoning_ended,
                    reasoning_kwargs=r.reasoning_kwargs,
                    reasoning_budget=r.reasoning_budget,
                    stop_token_ids=r.grammar_stop_ids,
                )
            except (GrammarError, ReasoningError, CancelledError) as e:
                r.finish(FinishReason.ERROR, error=str(e) or "grammar compilation was cancelled")
                out.append((r.client, self._final_of(r)))
                self.requests.pop(r.key, None)
                continue
            r.status = Status.RUNNING
            self.runner.add(r)
            self.running.append(r)
            room -= 1
        still.extend(waiting)
        self.waiting = still

    # ----- one step ---------------------------------------------------------------

    def step(self) -> list[Output]:
        out: list[Output] = []
        self._schedule(out)
        batch = self.running
        if not batch:
            return out
        forward = self._model_thread.submit(self.runner.forward, batch)
        cons, ok = self._prepare(batch, out)
        sb = self._sampling_batch(batch)  # while the forward pass runs, like _prepare
        logits = forward.result()
        tokens = self.sampler.sample(logits, sb, cons)
        self.num_steps += 1
        self._commit(batch, tokens, ok, out)
        return out

    def _prepare(
        self, batch: list[EngineRequest], out: list[Output]
    ) -> tuple[StepConstraints, list[bool]]:
        """Feed last step's tokens to the guides; gather this step's masks, bans and
        forced tokens."""
        ok = [True] * len(batch)
        fill_rows: list[int] = []
        fill_guides = []
        ban_rows: list[int] = []
        ban_ids: list[int] = []
        forced_rows: list[int] = []
        forced_ids: list[int] = []
        for i, r in enumerate(batch):
            g = r.guide
            if g is not None:
                if r.pending is not None:
                    try:
                        g.accept(r.pending, r.output_ids)
                    except GuideError as e:
                        ok[i] = False
                        r.pending = None
                        r.finish(FinishReason.ERROR, error=str(e))
                        out.append((r.client, self._final_of(r)))
                        self.requests.pop(r.key, None)
                        continue
                if g.needs_mask:
                    fill_rows.append(i)
                    fill_guides.append(g)
                elif g.thinking:
                    f = g.forced_token()
                    if f is not None:
                        forced_rows.append(i)
                        forced_ids.append(f)
                    if g.banned:
                        ban_rows.extend([i] * len(g.banned))
                        ban_ids.extend(g.banned)
            r.pending = None
            if len(r.output_ids) < r.min_tokens and r.stop_ids:
                ban_rows.extend([i] * len(r.stop_ids))
                ban_ids.extend(r.stop_ids)
        mask = self.so.fill(fill_rows, fill_guides) if fill_rows else None
        cons = StepConstraints(
            mask=mask,
            ban_rows=np.asarray(ban_rows, dtype=np.int64),
            ban_ids=np.asarray(ban_ids, dtype=np.int64),
            forced_rows=np.asarray(forced_rows, dtype=np.int64),
            forced_ids=np.asarray(forced_ids, dtype=np.int64),
        )
        return cons, ok

    def _sampling_batch(self, batch: list[EngineRequest]) -> SamplingBatch:
        n = len(batch)
        u = self.rng.random(n)
        for i, r in enumerate(batch):
            if r.generator is not None:
                u[i] = r.generator.random()
        return SamplingBatch(
            temperature=np.fromiter((r.temperature for r in batch), np.float32, n),
            top_p=np.fromiter((r.top_p for r in batch), np.float32, n),
            top_k=np.fromiter((r.top_k for r in batch), np.int64, n),
            uniforms=u,
        )

    def _commit(
        self, batch: list[EngineRequest], tokens: np.ndarray, ok: list[bool], out: list[Output]
    ) -> None:
        for i, r in enumerate(batch):
            if not ok[i] or r.status == Status.FINISHED:
                continue
            tok = int(tokens[i])
            if tok < 0:
                r.finish(FinishReason.ERROR, error="the grammar allows no token here")
                out.append((r.client, self._final_of(r)))
                self.requests.pop(r.key, None)
                continue
            r.output_ids.append(tok)
            r.pending = tok
            n = len(r.output_ids)
            if tok in r.stop_ids and n >= r.min_tokens:
                r.finish(FinishReason.STOP, stop=tok)
            elif (
                r.guide is not None
                and r.guide.matcher is not None
                and tok in r.grammar_stop_ids
                and r.guide.needs_mask
            ):
                r.finish(FinishReason.STOP, stop=tok)  # the grammar ended (ignore_eos aside)
            elif n >= r.max_tokens:
                r.finish(FinishReason.LENGTH)
            if r.status == Status.FINISHED:
                self.requests.pop(r.key, None)
                out.append((r.client, self._final_of(r)))
            else:
                out.append(
                    (
                        r.client,
                        EngineCoreOutput(
                            r.request_id,
                            r.output_ids[r.num_sent :],
                            num_reasoning_tokens=r.guide.num_reasoning_tokens if r.guide else 0,
                        ),
                    )
                )
                r.num_sent = n

    def _final_of(self, r: EngineRequest) -> EngineCoreOutput:
        new = r.output_ids[r.num_sent :]
        r.num_sent = len(r.output_ids)
        g = r.guide
        if g is not None and r.pending is not None:
            try:  # the last token counts too (for the reasoning token count)
                g.accept(r.pending, r.output_ids)
            except GuideError:
                pass
            r.pending = None
        return EngineCoreOutput(
            r.request_id,
            new,
            finish_reason=r.finish_reason,
            stop_reason=r.stop_reason,
            error=r.error,
            num_reasoning_tokens=g.num_reasoning_tokens if g is not None else 0,
        )

    def close(self) -> None:
        self._model_thread.shutdown(wait=True)
        self.runner.close()
        self.so.close()


def _grammar_of(f: Future[xgr.CompiledGrammar] | None) -> xgr.CompiledGrammar | None:
    """The grammar of a finished compile. Its error is raised as a new GrammarError:
    re-raising the stored one (``f.result()``) would tie the raising frames, and the
    batch they hold, to a future other requests share, until the garbage collector
    ran."""
    if f is None:
        return None
    exc = f.exception()
    if exc is not None:
        raise GrammarError(str(exc))
    return f.result()


def _final(request_id: str, reason: FinishReason, *, error: str | None = None) -> EngineCoreOutput:
    return EngineCoreOutput(request_id, [], finish_reason=reason, error=error)
