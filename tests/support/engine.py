"""The one engine harness of the tests: an asyncio loop in a thread of its own (so that
synchronous test code can drive async clients), a client on it to an engine it spawns
or to one already serving, an engine started the way an operator starts it
(``python -m engine_core``, its log in a file), and `collect` for one request's
outputs."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from engine_core.client import EngineClient, RequestOutput
from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, private_ipc_address
from structured_output.config import StructuredOutputConfig

from .processes import ROOT, child_env

T = TypeVar("T")

#: for the engines of tests that do not test the compile workers: grammars compile in
#: the engine itself, once (``--compile-workers 0``), with no worker process to start
#: (each imports torch and xgrammar, ~4 CPU-seconds) and none compiling each grammar a
#: second time; a time limit that a loaded machine does not reach (a compile in the
#: engine shares its CPU with the engine's own start-up and steps)
NO_WORKERS = StructuredOutputConfig(compile_workers=0, compile_timeout_s=60)
#: for those that test the workers but need only one
ONE_WORKER = StructuredOutputConfig(compile_workers=1)


class LoopThread:
    """An asyncio loop in a thread, so synchronous test code can drive clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, fn: Callable[[], Awaitable[T]], timeout: float = 600.0) -> T:
        """Run the coroutine ``fn()`` on the loop and wait for its result."""
        return self.submit(fn).result(timeout)

    def submit(self, fn: Callable[[], Awaitable[T]]) -> Future[T]:
        async def call() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class EngineHarness:
    """A client on a `LoopThread` of its own: to an engine it spawns from ``config``
    (shut down on `close`), or to one already serving at ``address`` (left running)."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        address: str | None = None,
        startup_timeout_s: float = 180.0,
    ) -> None:
        assert (config is None) != (address is None), "a config to spawn, or an address"
        self.config = config
        self._owns_engine = address is None
        self.loop = LoopThread()
        try:
            if address is None:
                assert config is not None
                self.client: EngineClient = self.run(
                    lambda: EngineClient.spawn(config, startup_timeout_s=startup_timeout_s)
                )
            else:
                self.client = self.run(
                    lambda: EngineClient.connect(address, timeout_s=startup_timeout_s)
                )
        except BaseException:
            self.loop.close()
            raise

    def run(self, fn: Callable[[], Awaitable[T]], timeout: float = 600.0) -> T:
        """Run the coroutine ``fn()`` on the harness loop and wait for its result."""
        return self.loop.run(fn, timeout)

    def close(self) -> None:
        try:
            end = self.client.shutdown if self._owns_engine else self.client.close
            self.run(end, timeout=60)
        finally:
            self.loop.close()


class ServedEngine:
    """``python -m engine_core ARGS`` (or ``python -m thinkgate serve ARGS``) on a
    private ipc:// socket, its stdout and stderr in ``log_path``."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        *,
        command: str = "engine_core",
        address: str | None = None,
        startup_timeout_s: float = 180.0,
    ) -> None:
        self._own_dir = None
        if address is None:
            address, self._own_dir = private_ipc_address()
        self.address = address
        self.log_path = log_path
        head = ["-m", "engine_core"] if command == "engine_core" else ["-m", "thinkgate", "serve"]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, *head, *args, "--address", address],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=child_env(),
            cwd=ROOT,
        )
        deadline = time.monotonic() + startup_timeout_s
        while "listening on" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the engine did not start ({self.proc.returncode}):\n{self.log()}"
                )
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
        return self.proc.returncode


class Served(EngineHarness):
    """A `ServedEngine` and a harness client connected to it; `close` stops both and
    returns the engine's exit status."""

    def __init__(self, args: Sequence[str], log_path: Path, **kwargs: Any) -> None:
        self.engine = ServedEngine(args, log_path, **kwargs)
        try:
            super().__init__(address=self.engine.address, startup_timeout_s=120)
        except BaseException:
            self.engine.stop()
            raise

    def close(self) -> int:  # type: ignore[override]
        try:
            super().close()
        finally:
            code = self.engine.stop()
        return code


async def collect(
    client: EngineClient, request: EngineCoreRequest, **kwargs: Any
) -> tuple[list[int], RequestOutput, int]:
    """All token ids of a request, its final output, and how many outputs had a
    finish reason (exactly one, always)."""
    ids: list[int] = []
    final = None
    finals = 0
    async for out in client.generate(request, **kwargs):
        ids += out.new_token_ids
        if out.finished:
            finals += 1
            final = out
    assert final is not None
    return ids, final, finals
