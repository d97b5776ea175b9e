"""A real engine process for the front-end tests: the scripted model on the bundled
Qwen3 vocabulary, driven through a real socket by the shared test harness."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_core.config import EngineConfig
from frontend.config import FrontendConfig
from frontend.serving import ChatFrontend
from structured_output.config import StructuredOutputConfig
from tests.support.engine import EngineHarness


class Engine(EngineHarness):
    def frontend(self, **config: Any) -> ChatFrontend:
        """A front end for this engine with the given `FrontendConfig` fields."""
        return ChatFrontend.create(self.client, FrontendConfig(**config))


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory):
    """``engine_factory(rules, **engine_config)``: the scripted model following
    ``rules`` (see engine_core/runners/scripted.py; default: the qwen3 vocabulary, on
    the CPU), shut down with the module."""
    engines: list[Engine] = []

    def make(rules: list[dict[str, str]], **config: Any) -> Engine:
        script = tmp_path_factory.mktemp("engine") / "script.json"
        script.write_text(json.dumps({"rules": rules, "default": "Nothing is scripted."}))
        settings: dict[str, Any] = {
            "tokenizer": "qwen3",
            "device": "cpu",
            "structured_output": StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
        }
        cfg = EngineConfig(
            model="scripted", runner_options={"script": str(script)}, **{**settings, **config}
        )
        engines.append(Engine(cfg))
        return engines[-1]

    yield make
    for e in engines:
        e.close()
