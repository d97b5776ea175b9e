"""The engine core: admission, one step of the batch, and finishing requests.

One step, for the running batch:

1. launch the model's forward pass on the model thread;
2. meanwhile, feed last step's tokens to each request's guide (reasoning tracker
   and grammar), and fill the bitmask rows of the requests whose grammar is active,
   in one batched call;
3. take the logits, apply the masks, sample;
4. append the tokens, finish what stopped, and report.

With drafts (``--draft-tokens``), step 1 also scores each row's draft tokens, and steps
3 and 4 go on position by position over the rows whose drafts the sampler confirmed
(`multi_token.verify_drafts`).

Nothing a request carries ends the engine: an exception while admitting, compiling,
starting, feeding, filling, sampling, committing or finishing one request ends that
request with an error, and the others go on (a batched call that raises is retried
row by row to find the rows at fault, see `isolation.py`; a failed forward pass ends
the requests of its step). Every request ends in `_finish`, which sends its one final
output. What a request must satisfy to be admitted is in `admission.py`; how a step's
constraints and sampling settings are gathered, in `step_inputs.py`.

`EngineCore` never touches a socket: `server.py` moves messages between the sockets
and this object, and reads its state through `stats`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ipc import ENGINE_FULL, EngineCoreOutput, EngineCoreRequest, FinishReason
from structured_output import GrammarError
from structured_output.bitmask import FilledMask
from structured_output.jump_forward import ForcedTokens
from structured_output.manager import StructuredOutputManager

from .admission import check_request, error_message, spec_of
from .config import EngineConfig
from .cpu_threads import serial_if_one_engine_process
from .drafts import NgramDrafter
from .isolation import sample_isolating
from .logprobs import StepLogprobs
from .multi_token import jump, jump_at_start, verify_drafts
from .request import EngineRequest, Status
from .runners import RunnerOptions, create_runner
from .sampler import Sampler, SamplingBatch, StepConstraints
from .step_inputs import gather_constraints, sampling_batch

if TYPE_CHECKING:
    import xgrammar as xgr

log = logging.getLogger(__name__)

Output = tuple[bytes, EngineCoreOutput]


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What the engine holds now (the health reply's counters)."""

    num_running: int
    num_waiting: int
    num_steps: int
    #: requests tracked, waiting or running, not yet ended
    num_requests: int
    #: per-request guides still alive
    num_guides: int
    #: grammar compiles queued or running
    num_compiling: int
    num_cached_grammars: int
    #: grammars compiled, the seconds their compiles took, and submissions answered
    #: from the compiled-grammar cache
    num_compiled_grammars: int
    compile_seconds: float
    num_grammar_cache_hits: int
    #: steps that filled bitmask rows, the rows filled, and the seconds the fills took
    num_fill_steps: int
    num_fill_rows: int
    fill_seconds: float


class EngineCore:
    def __init__(self, config: EngineConfig, tokenizer, *, device: str | None = None) -> None:
        """``device``: ``config.resolved_device()`` when not given. Whatever start-up
        built before a failure is closed again."""
        serial_if_one_engine_process()  # before any torch op (cpu_threads.py)
        self.config = config
        self.device = device or config.resolved_device()
        self._model_thread: ThreadPoolExecutor | None = None
        self.runner = None
        self.structured_output: StructuredOutputManager | None = None
        try:
            self.runner = create_runner(
                config.model,
                tokenizer,
                RunnerOptions(
                    device=self.device,
                    seed=config.seed,
                    max_num_seqs=config.max_num_seqs,
                    dtype=config.dtype,
                    max_num_batched_tokens=config.max_num_batched_tokens,
                    own=config.runner_options,
                ),
            )
            if self.runner.vocab_rows != tokenizer.vocab_rows:
                tokenizer = tokenizer.with_vocab_rows(self.runner.vocab_rows)
            self.structured_output = StructuredOutputManager(
                tokenizer,
                reasoning_parser=config.reasoning_parser,
                max_num_seqs=config.max_num_seqs,
                config=config.structured_output,
                pin_memory=self.device.startswith("cuda"),
            )
        except BaseException:
            self.close()
            raise
        self.tokenizer = tokenizer
        self.vocab_rows = tokenizer.vocab_rows
        self.sampler = Sampler(self.vocab_rows)
        self.model_stop_ids = tuple(tokenizer.stop_token_ids)
        #: the forced text's tokens, with jump forward on
        self.forced = (
            ForcedTokens(
                lambda s: tokenizer.encode(s, special=False),
                tokenizer.all_token_bytes,
                tokenizer.vocab_rows,
                tokenizer.special_ids,
            )
            if config.jump_forward
            else None
        )
        #: tokens appended by jump forward, not sampled
        self.num_jumped_tokens = 0
        if config.draft_tokens < 0 or (config.draft_tokens and not self.runner.multi_token):
            self.close()
            why = "must be 0 or more" if config.draft_tokens < 0 else "this model takes none"
            raise ValueError(f"--draft-tokens {config.draft_tokens}: {why}")
        #: the draft source, with ``--draft-tokens`` above 0
        self.drafter = NgramDrafter(config.draft_tokens) if config.draft_tokens else None
        #: draft tokens proposed, and those accepted
        self.num_draft_tokens = 0
        self.num_accepted_drafts = 0
        #: rows of logits gathered for the sampler in a step with drafts
        self._draft_rows = None
        self.requests: dict[tuple[bytes, str], EngineRequest] = {}
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.rng = np.random.default_rng(config.seed)
        self.num_steps = 0
        #: outputs made since the last public call returned them
        self._out: list[Output] = []
        #: running requests that asked for log-probabilities
        self.num_logprob_requests = 0
        #: steps that filled bitmask rows, the rows, and the seconds the fills took
        self.num_fill_steps = 0
        self.num_fill_rows = 0
        self.fill_seconds = 0.0
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="thinkgate-model")

    # ----- requests in and out ---------------------------------------------------

    def add_request(self, client: bytes, req: EngineCoreRequest) -> list[Output]:
        """Queue a request; one that cannot run is answered at once with an error."""
        try:
            self._admit(client, req)
        except ValueError as e:  # the request's own fault (GrammarError, ReasoningError too)
            self._out.append((client, _refusal(req.request_id, str(e))))
        except Exception as e:  # noqa: BLE001 - ends this request only
            msg = error_message(e, "admitting the request", req.request_id)
            self._out.append((client, _refusal(req.request_id, msg)))
        return self._take()

    def _admit(self, client: bytes, req: EngineCoreRequest) -> None:
        if (client, req.request_id) in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        held, limit = len(self.requests), self.config.max_num_seqs + self.config.max_waiting
        if held >= limit:
            raise ValueError(
                f"{ENGINE_FULL}: it holds {held} requests ({self.config.max_num_seqs} "
                f"running, {self.config.max_waiting} waiting at most); retry later"
            )
        check_request(req, self.config, self.vocab_rows)
        if req.reasoning_ended is not None:
            self.structured_output.parser_for(req.reasoning_parser_kwargs)  # kwargs it rejects
        spec = spec_of(req)
        r = EngineRequest(
            client,
            req,
            model_stop_ids=self.model_stop_ids,
            model_seed=int(self.rng.integers(1 << 62)),
            spec=spec,
        )
        if spec is not None:
            r.grammar = self.structured_output.submit(spec)
        self.requests[r.key] = r
        self.waiting.append(r)

    def abort(self, client: bytes, request_ids: Iterable[str]) -> list[Output]:
        for rid in request_ids:
            r = self.requests.get((client, rid))
            if r is not None:
                self._finish(r, FinishReason.ABORT)
        return self._take()

    def abort_all(self, error: str) -> list[Output]:
        """End every request (the engine is stopping): each gets its final output,
        aborted, with ``error`` saying why."""
        for r in list(self.requests.values()):
            self._finish(r, FinishReason.ABORT, error=error)
        return self._take()

    def drop_client(self, client: bytes) -> int:
        """End every request of a client that went away (nothing is sent to it)."""
        mine = [r for r in self.requests.values() if r.client == client]
        for r in mine:
            self._finish(r, FinishReason.ABORT, notify=False)
        return len(mine)

    def _finish(
        self,
        r: EngineRequest,
        reason: FinishReason,
        *,
        error: str | None = None,
        stop: int | None = None,
        notify: bool = True,
    ) -> None:
        """End ``r``: its last token reaches its guide (it counts, for the reasoning
        token count, and a grammar that rejects it turns a normal finish into an
        error), the engine forgets it, and its final output is queued. The one place
        a request ends; it never raises."""
        if r.status == Status.FINISHED:
            return
        g, count = r.guide, 0
        if g is not None:
            try:
                if r.pending is not None:
                    tok, r.pending = r.pending, None
                    g.accept(tok, r.output_ids)
                count = g.num_reasoning_tokens
            except Exception as e:  # noqa: BLE001 - the request ends either way
                msg = error_message(e, "finishing the request", r.request_id)
                if reason in (FinishReason.STOP, FinishReason.LENGTH):
                    reason, error, stop = FinishReason.ERROR, msg, None
        r.finish(reason, error=error, stop=stop)
        r.guide = None
        self.requests.pop(r.key, None)
        if r.grammar is not None and r.spec is not None and not r.grammar.done():
            # Never cancelled here: requests with the same spec share the compile. One
            # that no request wants any more is skipped if it has not started.
            try:
                self.structured_output.release(r.spec, r.grammar)
            except Exception:  # the compile runs on, cached; the request ends regardless
                log.exception("releasing the grammar of request %r failed", r.request_id)
        if notify:
            self._out.append(
                (
                    r.client,
                    EngineCoreOutput(
                        r.request_id,
                        r.output_ids[r.num_sent :],
                        finish_reason=reason,
                        stop_reason=stop,
                        error=error,
                        num_reasoning_tokens=count,
                        logprobs=r.logprobs.take() if r.logprobs is not None else None,
                    ),
                )
            )
            r.num_sent = len(r.output_ids)

    def _fail(self, r: EngineRequest, e: BaseException, stage: str) -> None:
        self._finish(r, FinishReason.ERROR, error=error_message(e, stage, r.request_id))

    def _take(self) -> list[Output]:
        out, self._out = self._out, []
        return out

    # ----- state ------------------------------------------------------------------

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

    def stats(self) -> EngineStats:
        so = self.structured_output
        return EngineStats(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_steps=self.num_steps,
            num_requests=len(self.requests),
            num_guides=so.num_guides,
            num_compiling=so.num_compiling,
            num_cached_grammars=so.num_cached_grammars,
            num_compiled_grammars=so.compiler.num_compiled,
            compile_seconds=so.compiler.compile_seconds,
            num_grammar_cache_hits=so.compiler.num_cache_hits,
            num_fill_steps=self.num_fill_steps,
            num_fill_rows=self.num_fill_rows,
            fill_seconds=self.fill_seconds,
        )

    # ----- scheduling -----------------------------------------------------------

    def _schedule(self) -> None:
        """Drop finished rows; admit waiting requests whose grammar is ready, first
        come first served, up to ``max_num_seqs``. A request whose grammar is still
        compiling keeps its place and lets the ones behind it pass."""
        if any(r.status == Status.FINISHED for r in self.running):
            for r in self.running:
                if r.status == Status.FINISHED:
                    self._leave_runner(r)
                    if r.logprobs is not None:
                        self.num_logprob_requests -= 1
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
                self._start(r)
            except Exception as e:  # noqa: BLE001 - ends this request only
                self._fail(r, e, "starting the request")
                continue
            room -= 1
        still.extend(waiting)
        self.waiting = still

    def _start(self, r: EngineRequest) -> None:
        """Make the guide of ``r`` (its grammar has compiled) and add it to the batch."""
        r.guide = self.structured_output.make_guide(
            _grammar_of(r.grammar),
            prompt_token_ids=r.prompt_token_ids,
            reasoning_ended=r.reasoning_ended,
            reasoning_kwargs=r.reasoning_kwargs,
            reasoning_budget=r.reasoning_budget,
            stop_token_ids=r.grammar_stop_ids,
        )
        if self.forced is not None:
            self.num_jumped_tokens += jump_at_start(r, self.forced)
        try:
            self.runner.add(r)
        except BaseException:
            self._leave_runner(r)
            raise
        r.status = Status.RUNNING
        if r.logprobs is not None:
            self.num_logprob_requests += 1
        self.running.append(r)

    def _leave_runner(self, r: EngineRequest) -> None:
        try:
            self.runner.remove(r)
        except Exception:  # the request has ended already; the runner's state is its own
            log.exception("the runner failed to remove request %r", r.request_id)

    # ----- one step ---------------------------------------------------------------

    def step(self) -> list[Output]:
        self._schedule()
        batch = self.running
        if batch:
            try:
                self._step(batch)
            except Exception as e:  # noqa: BLE001 - a fault no row was found to cause
                for r in batch:
                    self._fail(r, e, "running its step")
        return self._take()

    def _step(self, running: list[EngineRequest]) -> None:
        drafts = self._propose(running) if self.drafter is not None else None
        plan = self.runner.plan(running, drafts)
        forward = self._model_thread.submit(self.runner.forward, plan)
        # rows left out of plan.ready are still prefilling their prompt: no logits yet
        batch = running if plan.ready is None else [running[i] for i in plan.ready]
        if drafts is not None and plan.ready is not None:
            drafts = [drafts[i] for i in plan.ready]
        try:
            cons, live = self._prepare(batch)
            sb = self._sampling_batch(batch)  # while the forward pass runs, like _prepare
        except BaseException:
            wait_for([forward])  # it reads the rows: let it end before anything else
            raise
        try:
            logits = forward.result()
        except Exception as e:  # noqa: BLE001 - the model failed, not a request
            log.error("the forward pass failed; ending the %d requests of its step", len(running))
            for r in running:
                self._fail(r, e, "running the model's forward pass")
            return
        if not batch:
            self.num_steps += 1
            return
        # each row's logits after its known tokens come first, drafts or not
        first = logits if drafts is None else logits[: len(batch)]
        # before the sampler edits the logits in place
        lp = StepLogprobs.gather(first, batch) if self.num_logprob_requests else None
        tokens = self._sample(first, sb, cons, batch, live)
        if lp is not None:
            lp.record(tokens)
        self.num_steps += 1
        if drafts is None:
            self._commit(batch, tokens, live)
        else:
            verify_drafts(self, batch, drafts, tokens, live, logits, plan.logit_blocks())

    def _propose(self, running: list[EngineRequest]) -> list[list[int]] | None:
        """Each row's drafts (none for a row that has sampled nothing yet, so may still
        be prefilling, or that wants log-probabilities; never past ``max_tokens``); None
        when no row has any."""
        drafter = self.drafter
        assert drafter is not None
        out: list[list[int]] = []
        total = 0
        for r in running:
            room = r.max_tokens - len(r.output_ids) - 1  # the token sampled after them
            d = drafter.propose(r, room) if r.num_sent and r.logprobs is None else []
            out.append(d)
            total += len(d)
        self.num_draft_tokens += total
        return out if total else None

    def _sample(
        self,
        logits,
        sb: SamplingBatch,
        cons: StepConstraints,
        batch: list[EngineRequest],
        live: list[bool],
    ) -> np.ndarray:
        try:
            return self.sampler.sample(logits, sb, cons)
        except Exception as e:  # noqa: BLE001 - find the rows at fault
            fail = self._row_failer(batch, live, "sampling")
            return sample_isolating(self.sampler, logits, sb, cons, live, e, fail)

    def _row_failer(self, batch: list[EngineRequest], live: list[bool], stage: str):
        def fail(i: int, e: BaseException) -> None:
            live[i] = False
            self._fail(batch[i], e, stage)

        return fail

    def _prepare(self, batch: list[EngineRequest]) -> tuple[StepConstraints, list[bool]]:
        """Feed last step's tokens to the guides; gather this step's masks, bans and
        forced tokens. Also returns which rows are still live."""
        return gather_constraints(
            batch, self._fill, lambda i, e, stage: self._fail(batch[i], e, stage)
        )

    def _fill(self, rows: list[int], guides: list) -> FilledMask:
        t0 = time.perf_counter()
        mask = self.structured_output.fill(rows, guides)
        self.fill_seconds += time.perf_counter() - t0
        self.num_fill_steps += 1
        self.num_fill_rows += len(rows)
        return mask

    def _sampling_batch(self, batch: list[EngineRequest]) -> SamplingBatch:
        return sampling_batch(batch, self.rng)

    def _commit(self, batch: list[EngineRequest], tokens: np.ndarray, live: list[bool]) -> None:
        for i, r in enumerate(batch):
            if not live[i] or r.status == Status.FINISHED:
                continue
            try:
                if self._append(r, int(tokens[i])):
                    self._report(r)
            except Exception as e:  # noqa: BLE001 - ends this request only
                self._fail(r, e, "taking its sampled token")

    def _append(self, r: EngineRequest, tok: int) -> bool:
        """Append one token to the output of ``r`` (sampled, or a draft the sampler
        confirmed), to be fed to its guide before its next token is chosen; finish
        ``r`` where it stops. Whether ``r`` goes on."""
        if tok < 0:
            self._finish(r, FinishReason.ERROR, error="the grammar allows no token here")
            return False
        r.output_ids.append(tok)
        r.pending = tok
        n = len(r.output_ids)
        if tok in r.stop_ids and n >= r.min_tokens:
            self._finish(r, FinishReason.STOP, stop=tok)
        elif r.guide is not None and tok in r.grammar_stop_ids and _grammar_ended(r):
            self._finish(r, FinishReason.STOP, stop=tok)  # ignore_eos aside
        elif n >= r.max_tokens:
            self._finish(r, FinishReason.LENGTH)
        else:
            return True
        return False

    def _report(self, r: EngineRequest) -> None:
        """After the last token ``r`` takes this step (it goes on): jump forward over
        what its grammar forces, then queue its new tokens."""
        n = len(r.output_ids)
        if self.forced is not None:
            self.num_jumped_tokens += jump(r, self.forced)
            n = len(r.output_ids)
            if n >= r.max_tokens:
                self._finish(r, FinishReason.LENGTH)
                return
        self._out.append(
            (
                r.client,
                EngineCoreOutput(
                    r.request_id,
                    r.output_ids[r.num_sent :],
                    num_reasoning_tokens=r.guide.num_reasoning_tokens if r.guide is not None else 0,
                    logprobs=r.logprobs.take() if r.logprobs is not None else None,
                ),
            )
        )
        r.num_sent = n

    def close(self) -> None:
        """Stop the model thread, the runner and the grammar compilers (whatever of
        them start-up built)."""
        if self._model_thread is not None:
            self._model_thread.shutdown(wait=True)
        if self.runner is not None:
            try:
                self.runner.close()
            except Exception:
                log.exception("the runner failed to close")
        if self.structured_output is not None:
            self.structured_output.close()
        if getattr(self, "sampler", None) is not None:
            self.sampler.close()


def _grammar_ended(r: EngineRequest) -> bool:
    """Whether the stop token just sampled ends the grammar of ``r``: it is fed to the
    guide now (rather than next step), and the guide says."""
    g = r.guide
    assert g is not None
    tok, r.pending = r.pending, None
    if tok is not None:
        g.accept(tok, r.output_ids)
    return g.terminated


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


def _refusal(request_id: str, error: str) -> EngineCoreOutput:
    return EngineCoreOutput(request_id, [], finish_reason=FinishReason.ERROR, error=error)
