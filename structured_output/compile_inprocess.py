"""Compiles in the engine process itself (``--compile-workers 0``), under the time limit
a worker keeps.

Each compile runs on a daemon thread of its own (xgrammar releases the GIL while it
compiles), watched by the `CompileService` dispatcher thread that took its job. A
thread cannot be stopped: a compile past its time limit fails its requests as one in
a worker does, but runs on to its end, and its grammar is dropped. At most
``max_running`` compiles run at once, those past their limit included: a job that
finds every slot taken waits for one, its time limit running, so that specs that
never finish cannot pile up threads and memory without end. Nothing caps the memory
of a compile here: one that exhausts it, or crashes the compiler, takes the engine
down (in a worker, a capped address space and a process of its own make either one
request's error).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from .specs import GrammarError

T = TypeVar("T")
log = logging.getLogger(__name__)


class PastDeadline(Exception):
    """The deadline of `InProcessCompiles.run` came before its call's result."""


class InProcessCompiles:
    """Calls run on threads of their own, each awaited by its caller until a deadline."""

    def __init__(self, max_running: int, progress_s: float) -> None:
        if max_running < 1:
            raise ValueError("max_running must be at least 1")
        self.max_running = max_running
        self.progress_s = progress_s
        self._cond = threading.Condition()
        self._running = 0
        #: calls still running whose caller gave up on them (their deadline passed)
        self._overrunning: set[Future] = set()
        self._closed = False

    @property
    def num_running(self) -> int:
        """Calls running now, those past their deadline included."""
        return self._running

    @property
    def num_overrunning(self) -> int:
        """Calls still running past their deadline, their results to be dropped."""
        return len(self._overrunning)

    def run(self, call: Callable[[], T], deadline: float, on_wait: Callable[[], None]) -> T:
        """``call()``'s result, or what it raised, if it comes by ``deadline`` (a
        `time.monotonic` time). `PastDeadline` when the deadline comes first, the wait
        for a free slot included: the call runs on and its result is dropped.
        `GrammarError` once `close` is called. ``on_wait`` is called every
        ``progress_s`` while the call runs."""
        box: Future[T] = Future()
        with self._cond:
            while not self._closed and self._running >= self.max_running:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PastDeadline
                self._cond.wait(left)
            if self._closed:
                raise _closing()
            self._running += 1
        began = time.monotonic()
        try:
            threading.Thread(
                target=self._call, args=(call, box, began), name="thinkgate-compile", daemon=True
            ).start()
        except BaseException:
            self._done()
            raise
        report = began + self.progress_s
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: box.done() or self._closed,
                    min(deadline, report) - time.monotonic(),
                )
                if box.done():
                    break
                if self._closed:
                    raise _closing()
                now = time.monotonic()
                if now >= deadline:
                    self._overrunning.add(box)
                    raise PastDeadline
            if now >= report:
                on_wait()
                report += self.progress_s
        return box.result()

    def close(self) -> None:
        """Wake every caller at once (each gets `GrammarError`); calls under way run on
        to their end on their daemon threads, their results dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _call(self, call: Callable[[], T], box: Future[T], began: float) -> None:
        try:
            result = call()
        except BaseException as e:  # handed to the caller, whatever it is
            box.set_exception(e)
        else:
            box.set_result(result)
        finally:
            self._done(box, began)

    def _done(self, box: Future | None = None, began: float = 0.0) -> None:
        with self._cond:
            self._running -= 1
            if box in self._overrunning:
                self._overrunning.discard(box)
                log.info(
                    "a compile past its time limit ended after %.1f s; its result is dropped",
                    time.monotonic() - began,
                )
            self._cond.notify_all()


def _closing() -> GrammarError:
    return GrammarError("the engine is shutting down")
