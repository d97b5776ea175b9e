"""A real engine process for the front-end tests: the scripted model on the bundled
Qwen3 vocabulary, driven through a real socket, on an event loop of its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from engine_core.client import EngineClient
from engine_core.config import EngineConfig
from frontend.config import FrontendConfig
from frontend.serving import ChatFrontend

T = TypeVar("T")


@dataclass
class Engine:
    """A spawned engine and the loop its client lives on."""

    loop: asyncio.AbstractEventLoop
    client: EngineClient

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def frontend(self, **config: Any) -> ChatFrontend:
        return ChatFrontend.create(self.client, FrontendConfig(**config))


def spawn_engine(tmp: Path, rules: list[dict[str, str]], **config: Any) -> Iterator[Engine]:
    """Spawn the scripted model with ``rules`` (see engine_core/runners/scripted.py);
    yield it; shut it down."""
    script = tmp / "script.json"
    script.write_text(json.dumps({"rules": rules, "default": "I have nothing scripted."}))
    loop = asyncio.new_event_loop()
    cfg = EngineConfig(
        model="scripted",
        tokenizer="qwen3",
        script=str(script),
        device="cpu",
        compile_workers=1,
        **config,
    )
    client = loop.run_until_complete(EngineClient.spawn(cfg))
    try:
        yield Engine(loop, client)
    finally:
        loop.run_until_complete(client.shutdown())
        loop.close()


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory):
    """For modules that define their own script: ``engine_factory(rules, **config)``."""
    engines: list[Iterator[Engine]] = []

    def make(rules: list[dict[str, str]], **config: Any) -> Engine:
        gen = spawn_engine(tmp_path_factory.mktemp("engine"), rules, **config)
        engines.append(gen)
        return next(gen)

    yield make
    for gen in engines:
        for _ in gen:
            pass
