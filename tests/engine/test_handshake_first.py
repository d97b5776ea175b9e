"""The engine answers its handshake before its core is built, and nothing that
arrives meanwhile is lost: requests wait for the core, health checks are answered.

The core's construction is held at a gate the test opens only after it has its
handshake and has sent a request and a health check, so the order is forced, not
timed: an engine that built the core first would never answer, and the test would
time out."""

from __future__ import annotations

import asyncio
import threading
import time

from engine_core import server
from engine_core.client import EngineClient
from engine_core.config import EngineConfig
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from tests.support.engine import NO_WORKERS, collect


def test_handshake_and_health_before_the_core_and_requests_wait_for_it(tmp_path, monkeypatch):
    building, gate = threading.Event(), threading.Event()
    real = server.EngineCore or server._engine_core_class()

    def gated_core(config, tokenizer):
        building.set()
        assert gate.wait(120), "the test never opened the gate"
        return real(config, tokenizer)

    monkeypatch.setattr(server, "EngineCore", gated_core)
    address = f"ipc://{tmp_path}/engine.sock"
    config = EngineConfig(model="random", address=address, seed=1, structured_output=NO_WORKERS)
    made: list[server.EngineServer] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            made.append(server.EngineServer(config))
            made[0].serve()
        except BaseException as e:  # reported by the test below
            errors.append(e)

    thread = threading.Thread(target=run, name="engine-under-test", daemon=True)
    thread.start()
    assert building.wait(120), errors

    async def body():
        client = await EngineClient.connect(address, timeout_s=60)
        try:
            assert client.handshake is not None and client.handshake.vocab_rows == 151936
            spec = StructuredOutputSpec("json_schema", '{"type": "object"}')
            reqs = [
                EngineCoreRequest("plain", [1, 2, 3], SamplingParams(max_tokens=5, seed=1)),
                EngineCoreRequest("json", [1, 2, 3], SamplingParams(max_tokens=64, seed=2), spec),
            ]
            tasks = [asyncio.create_task(collect(client, r)) for r in reqs]
            for _ in range(100):  # until the IO thread has queued both
                health = await client.health(timeout_s=30)
                if health.num_waiting == 2:
                    break
                await asyncio.sleep(0.05)
            assert health.num_waiting == 2 and health.num_steps == 0
            assert not made  # the core is still being built
            gate.set()
            return await asyncio.wait_for(asyncio.gather(*tasks), 300)
        finally:
            gate.set()
            await client.close()

    try:
        results = asyncio.run(body())
    finally:
        gate.set()
        deadline = time.monotonic() + 120
        while not made and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)  # the core is still loading: stop the server once it exists
        if made:
            made[0].stop()
        thread.join(60)
    assert not errors, errors
    for ids, final, finals in results:
        assert finals == 1
        assert final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), final.error
        assert ids
