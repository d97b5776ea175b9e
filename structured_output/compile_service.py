"""Compiling grammars off the scheduling thread, with a time limit, a size limit and
a cache bounded in bytes.

Each worker process is driven by one dispatcher thread of this process. A compile
that outlives its time limit has its worker killed and replaced; the request gets a
`GrammarError`, and nothing else waits on it. A spec that compiled in its worker
within the bounds is compiled again here, on the dispatcher thread (xgrammar releases
the GIL while compiling): that is cheaper than carrying the compiled form across
(see `compile_worker`).

With no workers (``num_workers=0``) each spec is compiled once, here, on a thread
watched by a dispatcher (`compile_inprocess`): the same checks, limits, messages,
cache and sharing, without the workers' start-up (each imports torch and xgrammar)
and without their isolation.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from .compile_inprocess import InProcessCompiles, PastDeadline
from .compile_worker import CompileJob, CompileReply, WorkerInit, read_frame, write_frame
from .specs import (
    Compiled,
    CompileOptions,
    GrammarError,
    GrammarSpec,
    check_spec,
    compile_bounded,
    compile_constraint,
)

if TYPE_CHECKING:
    import xgrammar as xgr

    from tokenization import Tokenizer

log = logging.getLogger(__name__)

#: a compile still under way is reported this often, in seconds
PROGRESS_S = 5.0
#: with no workers: dispatcher threads, each watching one compile at a time (so that
#: one slow spec does not hold up the others), and the most compiles running at once,
#: those past their time limit (which cannot be stopped) included
IN_PROCESS_THREADS = 2
IN_PROCESS_MAX_RUNNING = 4
#: an idle dispatcher looks at its worker this often, in seconds, and replaces it
#: if it has died
IDLE_CHECK_S = 1.0

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


class GrammarCache:
    """Compiled grammars by spec, least recently used first out, bounded in bytes."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._items: OrderedDict[GrammarSpec, tuple[xgr.CompiledGrammar, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, spec: GrammarSpec) -> xgr.CompiledGrammar | None:
        with self._lock:
            item = self._items.get(spec)
            if item is None:
                return None
            self._items.move_to_end(spec)
            return item[0]

    def put(self, spec: GrammarSpec, grammar: xgr.CompiledGrammar) -> None:
        size = max(int(grammar.memory_size_bytes), len(spec.value))
        if size > self.limit_bytes:
            return
        with self._lock:
            old = self._items.pop(spec, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[spec] = (grammar, size)
            self._bytes += size
            while self._bytes > self.limit_bytes:
                _, (_, evicted) = self._items.popitem(last=False)
                self._bytes -= evicted

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)


class _Job:
    __slots__ = ("spec", "future", "wanted")

    def __init__(self, spec: GrammarSpec) -> None:
        self.spec = spec
        self.future: Future[xgr.CompiledGrammar] = Future()
        #: how many submissions still want this compile (requests share one job)
        self.wanted = 1


class _Worker:
    """One compile worker process, used by one dispatcher thread only (and killed by
    `CompileService.close` from another)."""

    def __init__(
        self,
        init: bytes,
        start_timeout_s: float,
        track: Callable[[_Worker], None],
        untrack: Callable[[_Worker], None],
    ) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = _PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "structured_output.compile_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.stdout = self.proc.stdout
        try:
            track(self)  # from now on `close` can stop it, even while it starts
        except BaseException:
            self.kill()
            raise
        try:
            write_frame(self.stdin, init)
            reply = self.read(start_timeout_s)
        except OSError:
            reply = None
        if reply is None or reply.job_id != -1:
            untrack(self)
            raise RuntimeError("grammar compile worker failed to start")

    def read(self, timeout_s: float) -> CompileReply | None:
        """The next reply, or None on timeout or a dead worker."""
        ready, _, _ = select.select([self.stdout], [], [], max(0.0, timeout_s))
        if not ready:
            return None
        raw = read_frame(self.stdout)  # the worker writes whole frames at once
        if raw is None:
            return None
        return msgspec.msgpack.decode(raw, type=CompileReply)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        for f in (self.stdin, self.stdout):
            try:
                f.close()
            except OSError:
                pass


class CompileService:
    """Asynchronous, cached, time-limited grammar compilation, in ``num_workers``
    worker processes, or in this process with 0."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        options: CompileOptions,
        tokenizer_info: xgr.TokenizerInfo | Future[xgr.TokenizerInfo],
        *,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        cache_bytes: int = 512 << 20,
        worker_memory_bytes: int = 8 << 30,
        max_compiled_bytes: int = 256 << 20,
        worker_start_timeout_s: float = 120.0,
        prepare: Callable[[Any], None] | None = None,
    ) -> None:
        """``prepare``: called with each newly compiled grammar on the thread that
        finished it, before any request gets it (the engine builds the tables its
        matchers will need there, off its step); an error in it is logged, and the
        grammar served all the same."""
        if num_workers < 0:
            raise ValueError(f"--compile-workers must be 0 or more, not {num_workers}")
        self.options = options
        self._prepare = prepare
        #: worker processes (0: compiles run in this process)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._max_compiled_bytes = max_compiled_bytes
        #: with no workers, the compiles run here
        self._in_process = (
            InProcessCompiles(IN_PROCESS_MAX_RUNNING, PROGRESS_S) if num_workers == 0 else None
        )
        self.cache = GrammarCache(cache_bytes)
        #: the vocabulary compiled grammars are loaded against (may still be building:
        #: the first grammar that comes back waits for it)
        self._info = tokenizer_info
        self._specials = dict(tokenizer.special_tokens)
        #: this process's compiler, made when the first spec passes its worker (with no
        #: workers: when the first spec is compiled)
        self._compiler: xgr.GrammarCompiler | None = None
        self._compiler_lock = threading.Lock()
        self._init = (
            b""
            if num_workers == 0
            else _worker_init(tokenizer, options, worker_memory_bytes, max_compiled_bytes)
        )
        self._start_timeout_s = worker_start_timeout_s
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._inflight: dict[GrammarSpec, _Job] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        #: every worker process alive (started or starting), so that `close` can stop
        #: them at once, whatever their dispatcher is waiting for
        self._workers: set[_Worker] = set()
        self.num_timeouts = 0
        self.num_compiled = 0
        #: seconds the successful compiles took (the worker's round trip), in total
        self.compile_seconds = 0.0
        #: submissions answered from the cache
        self.num_cache_hits = 0
        self._threads = [
            threading.Thread(target=self._dispatch, name=f"thinkgate-compile-{i}", daemon=True)
            for i in range(num_workers or IN_PROCESS_THREADS)
        ]
        for t in self._threads:
            t.start()

    def submit(self, spec: GrammarSpec) -> Future[xgr.CompiledGrammar]:
        """A future of the compiled grammar (already done on a cache hit or a spec
        that fails its checks). Never blocks."""
        hit = self.cache.get(spec)
        if hit is not None:
            self.num_cache_hits += 1
            return _done(hit)
        try:
            check_spec(spec, self.options)
        except GrammarError as e:
            return _failed(e)
        with self._lock:
            if self._closed:
                return _failed(GrammarError("the engine is shutting down"))
            job = self._inflight.get(spec)
            if job is None:
                job = self._inflight[spec] = _Job(spec)
                self._jobs.put(job)
            else:
                job.wanted += 1
        return job.future

    def release(self, spec: GrammarSpec, future: Future[xgr.CompiledGrammar]) -> None:
        """A submission of ``spec`` no longer wants its grammar (its request ended).
        A compile nobody wants any more is skipped if it has not started; one that has
        started runs on (bounded by the time limit) and is cached. The future is never
        cancelled under another request that shares it."""
        with self._lock:
            job = self._inflight.get(spec)
            if job is None or job.future is not future:
                return
            job.wanted -= 1
            if job.wanted <= 0 and job.future.cancel():
                del self._inflight[spec]

    @property
    def num_pending(self) -> int:
        """Compiles queued or running."""
        return len(self._inflight)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop at once: the workers are killed (a compile under way fails its
        requests; a worker still starting does not finish), and the dispatchers end.
        Waits up to ``timeout_s`` for them. With no workers, a compile under way fails
        its requests too, and runs on to its end on its daemon thread."""
        with self._lock:
            self._closed = True
            workers = list(self._workers)
        for _ in self._threads:
            self._jobs.put(None)
        if self._in_process is not None:
            self._in_process.close()
        for w in workers:
            w.proc.kill()  # its dispatcher's read returns; the dispatcher reaps it
        deadline = time.monotonic() + timeout_s
        for w in workers:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("grammar compile worker %d did not exit", w.proc.pid)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _track(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the compile service is closed")
            self._workers.add(worker)

    def _untrack(self, worker: _Worker) -> None:
        with self._lock:
            self._workers.discard(worker)
        worker.kill()

    def _finish(
        self,
        job: _Job,
        grammar: xgr.CompiledGrammar | None,
        error: str | None,
        seconds: float = 0.0,
    ) -> None:
        with self._lock:
            if self._inflight.get(job.spec) is job:
                del self._inflight[job.spec]
            if grammar is not None:
                self.num_compiled += 1
                self.compile_seconds += seconds
        if grammar is not None:
            self.cache.put(job.spec, grammar)
            job.future.set_result(grammar)
        else:
            job.future.set_exception(GrammarError(error or "grammar compilation failed"))

    def _start_worker(self) -> _Worker | None:
        if self._closed:
            return None
        try:
            worker = _Worker(self._init, self._start_timeout_s, self._track, self._untrack)
        except (OSError, RuntimeError) as e:
            if not self._closed:
                log.error("cannot start a grammar compile worker: %s", e)
            return None
        log.info("grammar compile worker %d is ready", worker.proc.pid)
        return worker

    def _compile(
        self, worker: _Worker, job: _Job, deadline: float
    ) -> tuple[CompileReply | None, _Worker | None]:
        """Run ``job`` on ``worker`` by ``deadline``. Returns the reply (None: the time
        limit passed, or the compiler died) and the worker to use next (None: it was
        killed). A worker that dies on the job is replaced and the job tried once more,
        within the same deadline: the death may be no fault of the job's (the worker
        was killed from outside, or had died just before), and one that is the job's
        fault happens again."""
        for attempt in (1, 2):
            job_id = next(self._ids)
            try:
                write_frame(
                    worker.stdin,
                    msgspec.msgpack.encode(
                        CompileJob(
                            job_id,
                            job.spec.kind.value,
                            job.spec.value,
                            job.spec.ignore_unsupported,
                        )
                    ),
                )
            except OSError:
                reply = None
            else:
                reply = self._await(worker, job, deadline)
            if reply is not None and reply.job_id == job_id:
                return reply, worker
            # No reply before the deadline: its pipe closed, so it died. (poll() cannot
            # tell yet: a process closes its files before it becomes a zombie.)
            died = reply is None and time.monotonic() < deadline
            self._untrack(worker)
            if not died or attempt == 2 or self._closed:
                return None, None
            log.warning(
                "grammar compile worker %d died (code %s) on a %s; trying it once "
                "more on a new worker",
                worker.proc.pid,
                worker.proc.returncode,
                job.spec.kind.value,
            )
            new = self._start_worker()
            if new is None:
                return None, None
            worker = new
        return None, None

    def _await(self, worker: _Worker, job: _Job, deadline: float) -> CompileReply | None:
        """``worker``'s reply by ``deadline`` (None: none came, or it died), saying
        every few seconds that a long compile is still under way."""
        began = time.monotonic()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([worker.stdout], [], [], min(left, PROGRESS_S))
            if ready:
                return worker.read(0)
            self._still_compiling(job, began)

    def _dispatch(self) -> None:
        worker: _Worker | None = None
        try:
            while True:
                if worker is None and self._in_process is None and not self._closed:
                    worker = self._start_worker()
                try:
                    job = self._jobs.get(timeout=IDLE_CHECK_S)
                except queue.Empty:
                    # idle: a worker found dead now is replaced before the next job
                    # arrives, so that job does not wait on a start-up
                    worker = self._unless_dead(worker)
                    continue
                if job is None:
                    return
                if not job.future.set_running_or_notify_cancel():
                    continue  # released by every request that wanted it
                try:
                    if self._in_process is not None:
                        self._run_here(self._in_process, job)
                    else:
                        worker = self._run(worker, job)
                except Exception as e:
                    # Nothing may end this thread: the requests of every later job would
                    # wait for ever. This job fails; its worker, in an unknown state, goes.
                    log.exception("grammar compile dispatcher failed on a %s", job.spec.kind.value)
                    if worker is not None:
                        self._untrack(worker)
                        worker = None
                    if not job.future.done():
                        self._finish(job, None, f"internal error while compiling: {e!r}")
        finally:
            if worker is not None:
                self._untrack(worker)

    def _local_compiler(self) -> xgr.GrammarCompiler:
        import xgrammar as xgr

        with self._compiler_lock:  # not `_lock`: `submit` must never wait for the vocabulary
            if self._compiler is None:
                info = self._info.result() if isinstance(self._info, Future) else self._info
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def _run_here(self, compiles: InProcessCompiles, job: _Job) -> None:
        """Compile ``job`` in this process and settle its future."""
        compiler = self._local_compiler()
        began = time.monotonic()
        try:
            compiled = compiles.run(
                lambda: compile_bounded(
                    compiler, job.spec, self.options, self._specials, self._max_compiled_bytes
                ),
                began + self.timeout_s,
                lambda: self._still_compiling(job, began),
            )
        except PastDeadline:
            self.num_timeouts += 1
            log.warning(
                "a %s of %d bytes passed the compile time limit of %g s; it runs on in "
                "this process (it cannot be stopped) and its grammar will be dropped "
                "(%d such compiles running)",
                job.spec.kind.value,
                len(job.spec.value),
                self.timeout_s,
                compiles.num_overrunning,
            )
            self._finish(job, None, self._over_time(job))
        except GrammarError as e:
            self._finish(job, None, str(e))
        else:
            self._finish_compiled(job, compiled, began)

    def _over_time(self, job: _Job) -> str:
        return f"{job.spec.kind.value} compilation exceeded the time limit of {self.timeout_s:g} s"

    def _still_compiling(self, job: _Job, began: float) -> None:
        log.info(
            "still compiling a %s of %d bytes after %.0f s (time limit %g s)",
            job.spec.kind.value,
            len(job.spec.value),
            time.monotonic() - began,
            self.timeout_s,
        )

    def _finish_compiled(self, job: _Job, compiled: Compiled, began: float) -> None:
        from .guard import GuardedGrammar

        grammar = GuardedGrammar.wrap(compiled.grammar, compiled.json_text)
        if self._prepare is not None:
            try:
                self._prepare(grammar)
            except Exception:  # tables not built here are built on first use
                log.exception("preparing a compiled %s failed", job.spec.kind.value)
        took = time.monotonic() - began
        if took >= PROGRESS_S:
            log.info("compiled a %s in %.1f s", job.spec.kind.value, took)
        self._finish(job, grammar, None, took)

    def _unless_dead(self, worker: _Worker | None) -> _Worker | None:
        """``worker``, or None once it has exited (killed while idle, say)."""
        if worker is None or worker.proc.poll() is None:
            return worker
        log.warning(
            "grammar compile worker %d exited (code %s) while idle; starting another",
            worker.proc.pid,
            worker.proc.returncode,
        )
        self._untrack(worker)
        return None

    def _run(self, worker: _Worker | None, job: _Job) -> _Worker | None:
        """Compile ``job`` in a worker, then here, and settle its future; returns the
        worker to use next."""
        worker = self._unless_dead(worker)  # died idle: that is no fault of this job's
        if worker is None:  # the last start failed, or the worker died idle: try now
            worker = self._start_worker()
        if worker is None:
            self._finish(job, None, "no grammar compile worker is available")
            return None
        began = time.monotonic()
        deadline = began + self.timeout_s
        reply, worker = self._compile(worker, job, deadline)
        if reply is None:
            if time.monotonic() >= deadline:
                self.num_timeouts += 1
                msg = self._over_time(job)
            else:
                msg = f"the grammar compiler failed on this {job.spec.kind.value}"
            self._finish(job, None, msg)
        elif not reply.ok:
            self._finish(job, None, reply.error)
        else:
            try:
                compiled = compile_constraint(
                    self._local_compiler(), job.spec, self.options, self._specials
                )
            except GrammarError as e:  # it compiled in the worker: this is not expected
                self._finish(job, None, str(e))
            else:
                self._finish_compiled(job, compiled, began)
        return worker


def _worker_init(
    tokenizer: Tokenizer, options: CompileOptions, memory_bytes: int, max_compiled_bytes: int
) -> bytes:
    """What every worker is started with, encoded."""
    return msgspec.msgpack.encode(
        WorkerInit(
            token_bytes=list(tokenizer.all_token_bytes),
            vocab_rows=tokenizer.vocab_rows,
            stop_token_ids=list(tokenizer.stop_token_ids),
            special_tokens=dict(tokenizer.special_tokens),
            max_whitespace=options.max_whitespace,
            max_spec_bytes=options.max_spec_bytes,
            memory_limit_bytes=memory_bytes,
            max_compiled_bytes=max_compiled_bytes,
        )
    )


def _done(grammar: xgr.CompiledGrammar) -> Future[xgr.CompiledGrammar]:
    f: Future[xgr.CompiledGrammar] = Future()
    f.set_result(grammar)
    return f


def _failed(error: BaseException) -> Future[xgr.CompiledGrammar]:
    f: Future[xgr.CompiledGrammar] = Future()
    f.set_exception(error)
    return f
