"""Engines for the reliability tests: each module starts its own, as an operator would
(``python -m engine_core``), with its log in a file the tests read."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from engine_core.client import EngineClient

from .support import LoopThread, ServedEngine


@dataclass
class Served:
    engine: ServedEngine
    loop: LoopThread
    client: EngineClient

    def run(self, fn, timeout: float = 600.0):
        return self.loop.run(fn, timeout)


def serve(
    args: Sequence[str], tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[Served]:
    log = tmp_path_factory.mktemp(name) / "engine.log"
    engine = ServedEngine(args, log)
    loop = LoopThread()
    try:
        client = loop.run(lambda: EngineClient.connect(engine.address, timeout_s=120))
    except BaseException:
        engine.stop()
        loop.close()
        raise
    try:
        yield Served(engine, loop, client)
    finally:
        loop.run(client.close, 30)
        loop.close()
        code = engine.stop()
        print(f"{name}: engine exited with {code}; log at {log}")
