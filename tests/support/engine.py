"""A spawned engine and its client on an event loop of their own, for tests that
share one engine across several test functions."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from engine_core.client import EngineClient, RequestOutput
from engine_core.config import EngineConfig
from ipc import EngineCoreRequest

T = TypeVar("T")


class EngineHarness:
    def __init__(self, config: EngineConfig, *, startup_timeout_s: float = 180.0) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()
        self.client: EngineClient = self.run(
            lambda: EngineClient.spawn(config, startup_timeout_s=startup_timeout_s)
        )

    def run(self, fn: Callable[[], Awaitable[T]], timeout: float = 600.0) -> T:
        """Run the coroutine ``fn()`` on the harness loop and wait for its result."""

        async def call() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout)

    def close(self) -> None:
        try:
            self.run(lambda: self.client.shutdown(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


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
