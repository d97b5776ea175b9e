"""Persistent token-bitmask buffers and the batched fill.

Bit ``j`` of word ``w`` of a row allows token ``32 * w + j``. Buffers are allocated
once, for the largest batch; on CUDA they are pinned and double-buffered, so that one
step's host-to-device copy can still be in flight while the next step is filled.
"""

from __future__ import annotations

import math
import os
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .string_masks import after_fill, known_mask, known_source, use_known

if TYPE_CHECKING:
    from .guard import GuardTable
    from .guide import RequestGuide


def bitmask_words(vocab_rows: int) -> int:
    return (vocab_rows + 31) // 32


def fill_threads_for(setting: int, cpus: int | None = None) -> int:
    """The threads of a batched fill for the ``fill_threads`` setting: itself where
    given (> 0), else one per two CPUs the process may run on (``cpus``: `usable_cpus`),
    at least 2 and at most 8. A fill runs beside the step's other work (the forward
    pass, the sampler), so half the CPUs; vLLM sizes its fill pool the same way (at
    most 8), and a fixed 2 left most of a large host idle at 128 rows and up."""
    if setting < 0:
        raise ValueError(f"fill threads must be 0 (one per two CPUs) or more, not {setting}")
    if setting > 0:
        return setting
    return max(2, min(8, (usable_cpus() if cpus is None else cpus) // 2))


def usable_cpus(cgroup: str = "/sys/fs/cgroup") -> int:
    """The CPUs this process may run on (its affinity), or fewer where its cgroup's CPU
    quota allows fewer (a container's CPU limit: cgroup v2 ``cpu.max``, or v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), rounded up."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    cpus = cpus or os.cpu_count() or 1
    quota = _cgroup_quota(cgroup)
    return min(cpus, max(1, math.ceil(quota))) if quota is not None else cpus


def _cgroup_quota(root: str) -> float | None:
    """CPUs' worth of time per period the cgroup allows; None: no limit or none found."""
    base = Path(root)
    try:
        fields = (base / "cpu.max").read_text().split()
        if len(fields) == 2 and fields[0] != "max":
            return int(fields[0]) / int(fields[1])
        return None
    except (OSError, ValueError):
        pass
    try:
        quota = int((base / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((base / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


class FilledMask:
    """The result of one fill: ``buffer[rows]`` hold the masks of those batch rows."""

    __slots__ = ("buffer", "rows")

    def __init__(self, buffer: torch.Tensor, rows: np.ndarray) -> None:
        self.buffer = buffer
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)


class SharedFill:
    """Many rows filled by the calling thread and ``helpers`` more, each pulling the
    next chunk of rows from one list (xgrammar's batch call on one thread per chunk,
    without the GIL) until none is left.

    Unlike xgrammar's own threaded call, which splits the rows evenly and waits for
    every part, a thread that the OS does not run for a while (a busy machine) costs
    at most the chunk it holds: the others take the rest. A helper that wakes after
    the work is gone does nothing."""

    def __init__(self, helpers: int, chunk: int = 16) -> None:
        import xgrammar as xgr

        self.chunk = chunk
        self.helpers = max(0, helpers)
        self._own = xgr.BatchGrammarMatcher(max_threads=1)
        self._jobs: list[queue.SimpleQueue[_Job | None]] = []  # one per helper, once started

    def _start(self) -> None:
        import xgrammar as xgr

        for i in range(self.helpers):
            jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
            batch = xgr.BatchGrammarMatcher(max_threads=1)
            threading.Thread(
                target=_serve, args=(jobs, batch), name=f"thinkgate-fill-{i}", daemon=True
            ).start()
            self._jobs.append(jobs)

    def fill(
        self,
        matchers: list[Any],
        buf: torch.Tensor,
        rows: list[int],
        alone: int = 0,
        done: Callable[[int, int], None] | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        """Fill ``rows`` of ``buf`` from ``matchers``, a chunk of them at a time; the
        first ``alone`` rows each a chunk of its own (rows likely to cost far more than
        the others: two of them in one chunk would run one after the other).

        ``done(a, b)``, if given, runs on the calling thread once per chunk of indexes
        ``[a, b)`` filled, between the chunks it fills itself and at the end: the rows'
        Python work overlaps the helpers' fills, and no helper runs Python per row.
        ``meanwhile()``, if given, runs on the calling thread once the helpers have the
        job, before it fills any chunk."""
        if self.helpers and not self._jobs:
            self._start()  # the first fill starts the helpers
        n = len(rows)
        # chunks of at most ``chunk`` rows, and at least two per thread where the rows
        # allow it, so that a late thread leaves work to the others to take
        size = max(1, min(self.chunk, -(-(n - alone) // (2 * (self.helpers + 1)))))
        bounds = [(a, a + 1) for a in range(alone)]
        bounds += [(a, min(a + size, n)) for a in range(alone, n, size)]
        job = _Job(matchers, buf, rows, bounds)
        for jobs in self._jobs:
            jobs.put(job)
        seen = 0

        def drain() -> None:
            nonlocal seen
            while seen < len(job.filled):
                done(*bounds[job.filled[seen]])
                seen += 1

        # an error in this thread's own work is raised once every chunk is filled: no
        # helper may still write into the buffer when the caller handles it
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException as e:
                job.error, done = e, None
        job.work(self._own, drain if done is not None else None)
        job.wait()
        if done is not None:
            drain()

    def close(self) -> None:
        for jobs in self._jobs:
            jobs.put(None)
        self._jobs = []
        self.helpers = 0


class _Job:
    __slots__ = (
        "matchers",
        "buf",
        "rows",
        "bounds",
        "filled",
        "_taken",
        "_done",
        "_cond",
        "error",
    )

    def __init__(
        self, matchers: list[Any], buf: torch.Tensor, rows: list[int], bounds: list
    ) -> None:
        self.matchers, self.buf, self.rows, self.bounds = matchers, buf, rows, bounds
        self._taken = iter(range(len(bounds)))  # next() on it is atomic under the GIL
        #: the chunks filled without an error, in the order they were
        self.filled: list[int] = []
        self._done = 0
        self._cond = threading.Condition()
        self.error: BaseException | None = None

    def work(self, batch: Any, between: Callable[[], None] | None = None) -> None:
        for i in self._taken:
            a, b = self.bounds[i]
            try:
                batch.batch_fill_next_token_bitmask(self.matchers[a:b], self.buf, self.rows[a:b])
                self.filled.append(i)
            except BaseException as e:  # raised again in the thread that called fill
                self.error = e
            with self._cond:
                self._done += 1
                if self._done == len(self.bounds):
                    self._cond.notify_all()
            if between is not None:
                try:
                    between()
                except BaseException as e:  # raised by wait, after the last chunk
                    self.error, between = self.error or e, None

    def wait(self) -> None:
        with self._cond:
            while self._done < len(self.bounds):
                self._cond.wait()
        error, self.error = self.error, None  # nothing keeps the failed rows alive after
        if error is not None:
            raise error


def _serve(jobs: queue.SimpleQueue[_Job | None], batch: Any) -> None:
    while (job := jobs.get()) is not None:
        job.work(batch)
        del job  # not held (with its matchers) while this thread waits for the next


class BitmaskFiller:
    """Fills the rows of the batch whose grammar is active.

    Below ``batch_threshold`` rows a plain loop over the matchers is used; it also
    learns which rows restrict nothing and skips them, and ``guard`` (`guard.py`)
    combines each row of a `GuardedMatcher` with the mask of its state right after the
    row's fill. From ``batch_threshold`` rows on, ``max_threads`` threads share the
    rows' fills (`SharedFill`) while the step's thread copies, checks and guards them.
    """

    def __init__(
        self,
        max_rows: int,
        vocab_rows: int,
        *,
        pin_memory: bool = False,
        num_buffers: int = 1,
        batch_threshold: int = 128,
        max_threads: int = 2,
        guard: GuardTable | None = None,
    ) -> None:
        import xgrammar as xgr

        self.vocab_rows = vocab_rows
        self.words = bitmask_words(vocab_rows)
        self.buffers = [
            torch.full((max_rows, self.words), -1, dtype=torch.int32, pin_memory=pin_memory)
            for _ in range(max(1, num_buffers))
        ]
        self._views = [b.numpy().view(np.uint32) for b in self.buffers]
        #: each row of each buffer as a view of its own, made once (the guard ANDs rows)
        self._row_views = [list(v) for v in self._views]
        self._rows = self._row_views[0]
        #: ``0 .. max_rows - 1``, read-only: a one-row fill's active rows are a slice
        self._index = np.arange(max_rows, dtype=np.int64)
        self._index.setflags(write=False)
        self._next = 0
        self.batch_threshold = batch_threshold
        self._shared = SharedFill(max_threads - 1)
        self._fill_one = xgr.GrammarMatcher.fill_next_token_bitmask  # unguarded: see fill
        #: set once the engine's guard table is built (the manager waits for it before
        #: any guarded matcher exists)
        self.guard = guard

    def close(self) -> None:
        """Let the helper threads go (a fill after this runs on the calling thread)."""
        self._shared.close()

    def fill(self, rows: Sequence[int], guides: Sequence[RequestGuide]) -> FilledMask:
        """Fill ``rows`` from ``guides`` (same order; each with an active grammar): the
        grammar's mask plus the guide's `extra_allowed`, or those extra ids alone where
        the guide does not follow its grammar this step."""
        k = self._next
        self._next = (k + 1) % len(self.buffers)
        buf, view = self.buffers[k], self._views[k]
        self._rows = self._row_views[k]
        if not rows:
            return FilledMask(buf, np.empty(0, dtype=np.int64))
        if len(rows) == 1:  # the whole step's Python is this row's: no lists
            r, g = rows[0], guides[0]
            restricts = self._fill_row(buf, view, r, g.matcher)
            if not g.follows_grammar or g.extra_allowed():
                return self._extras(buf, view, rows, guides, [r] if restricts else [])
            return FilledMask(buf, self._index[r : r + 1] if restricts else self._index[:0])
        matchers = [g.matcher for g in guides]
        if len(rows) >= self.batch_threshold:
            self._fill_shared(buf, view, rows, matchers)
            active = np.asarray(rows, dtype=np.int64)
        else:  # each row guarded right after its fill, while its words are in cache
            fill_row = self._fill_row
            active = [r for r, m in zip(rows, matchers, strict=True) if fill_row(buf, view, r, m)]
        return self._extras(buf, view, rows, guides, active)

    def _fill_shared(
        self, buf: torch.Tensor, view: np.ndarray, rows: Sequence[int], matchers: list[Any]
    ) -> None:
        """Many rows on the threads. Rows whose mask is kept (inside a free string) or
        remembered are copied, not filled, on this thread while the helpers fill the
        others; the helpers run no Python (a thread waiting for Python's lock to do a
        row's bookkeeping is a core idle): this thread does each filled chunk's between
        the chunks it fills itself."""
        guard_row = self._guard_row
        sources = [known_source(m) for m in matchers]
        # the costliest first (mid-escape, not remembered yet: up to milliseconds), each
        # a chunk of its own, so that no thread starts one when the others are nearly
        # done, nor two of them one after the other
        first = [i for i, (src, key) in enumerate(sources) if src is None and key is not None]
        todo = first + [i for i, (src, key) in enumerate(sources) if src is None and key is None]

        def copies() -> None:  # while the helpers start on the fills
            for r, m, (src, key) in zip(rows, matchers, sources, strict=True):
                if src is not None:
                    use_known(m, view, r, src, key)
                    guard_row(r, m)

        if not todo:
            copies()
            return

        def done(a: int, b: int) -> None:  # as the chunks are filled
            for i in todo[a:b]:
                r, m = rows[i], matchers[i]
                after_fill(m, view, r, sources[i][1])
                guard_row(r, m)

        self._shared.fill(
            [matchers[i] for i in todo], buf, [rows[i] for i in todo], len(first), done, copies
        )

    def _fill_row(self, buf: torch.Tensor, view: np.ndarray, r: int, m: Any) -> bool:
        """Row ``r`` from matcher ``m``: its kept or remembered mask, or a fill, then the
        guard; whether the row restricts anything."""
        copied, key = known_mask(m, view, r)
        if copied:
            restricts = True  # inside a string: always restricted
        else:
            restricts = self._fill_one(m, buf, r)
            after_fill(m, view, r, key)
        return self._guard_row(r, m) or restricts

    def _guard_row(self, r: int, m: Any) -> bool:
        """AND row ``r`` of this step's buffer with the guard's mask for ``m``'s state;
        whether it has one."""
        q, guard = getattr(m, "guard_state", -1), self.guard
        return q >= 0 and guard is not None and guard.apply_row(self._rows[r], q, m.guard_lenient)

    def _extras(
        self,
        buf: torch.Tensor,
        view: np.ndarray,
        rows: Sequence[int],
        guides: Sequence[RequestGuide],
        active: Any,
    ) -> FilledMask:
        """Each guide's extra ids added to its row; a guide that does not follow its
        grammar this step gets them alone. ``active``: the rows filled that restrict."""
        active = np.asarray(active, dtype=np.int64)
        alone: list[int] = []  # rows whose mask is their extra ids alone
        for r, g in zip(rows, guides, strict=True):
            extra = g.extra_allowed()
            if not g.follows_grammar:
                view[r] = 0
                alone.append(r)
            if extra:
                ids = np.asarray(extra, dtype=np.int64)
                np.bitwise_or.at(view[r], ids >> 5, np.left_shift(1, ids & 31).astype(np.uint32))
        if alone:
            active = np.union1d(active, alone)
        return FilledMask(buf, active)
