"""The engine dies: killed under load, every request fails at once and a new engine
starts and serves; killed mid-compile, its compile workers do not outlive it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from engine_core.client import EngineClient, EngineDeadError
from engine_core.config import EngineConfig
from ipc import (
    EngineCoreRequest,
    FinishReason,
    SamplingParams,
    StructuredOutputSpec,
)
from structured_output.config import StructuredOutputConfig
from tests.support.engine import NO_WORKERS

from .support import (
    PROMPT,
    SCHEMA,
    SLOW_SCHEMA,
    alive,
    busy_worker,
    compile_workers,
    drain,
    figures_report,
    idle_workers,
    wait_until,
)

FIGURES: dict[str, object] = {}
report = figures_report("engine death", FIGURES)


def test_engine_killed_under_load_fails_every_request_within_2s_and_a_new_one_starts():
    async def body():
        client = await EngineClient.spawn(
            EngineConfig(model="random", reasoning_parser="qwen3", max_num_seqs=256, seed=5)
        )
        tok = client.tokenizer()
        think_prompt = tok.encode(
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        )
        failures: dict[str, float] = {}
        other: list[BaseException | str] = []

        async def one(i: int) -> None:
            kind = i % 4
            so = None
            if kind == 1:
                so = StructuredOutputSpec("json_schema", json.dumps(SCHEMA))
            elif kind == 2:
                so = StructuredOutputSpec("regex", "[a-z ]{1,20000}")
            req = EngineCoreRequest(
                f"load-{i}",
                think_prompt if kind == 3 else PROMPT,
                SamplingParams(max_tokens=30_000, ignore_eos=True, seed=i),
                so,
                reasoning_ended=False if kind == 3 else None,
            )
            try:
                async for out in client.generate(req):
                    if out.finished:
                        other.append(f"{req.request_id} ended: {out.finish_reason} {out.error}")
            except EngineDeadError:
                failures[req.request_id] = time.monotonic()
            except BaseException as e:  # noqa: BLE001 - reported below
                other.append(e)

        n = 300  # more than max_num_seqs: some are waiting when the engine dies
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        while (await client.health()).num_running < 200:
            await asyncio.sleep(0.1)
        workers = compile_workers(client.proc.pid)
        killed = time.monotonic()
        os.kill(client.proc.pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        # the dead engine refuses new work at once, and its workers do not outlive it
        with pytest.raises(EngineDeadError):
            await client.health()
        with pytest.raises(EngineDeadError):
            async for _ in client.generate(EngineCoreRequest("late", PROMPT)):
                pass
        await client.shutdown(timeout_s=5)
        orphans_gone = await asyncio.to_thread(
            wait_until, lambda: not any(alive(p) for p in workers), 30, "compile workers exit"
        )
        # a new engine starts and serves
        t0 = time.monotonic()
        fresh = await EngineClient.spawn(
            EngineConfig(model="random", seed=6, structured_output=NO_WORKERS)
        )
        try:
            startup = time.monotonic() - t0
            last = None
            async for out in fresh.generate(
                EngineCoreRequest("after", PROMPT, SamplingParams(max_tokens=5, ignore_eos=True))
            ):
                last = out
            assert last is not None and last.finish_reason == FinishReason.LENGTH
        finally:
            await fresh.shutdown()
        return n, killed, failures, other, orphans_gone, startup, len(workers)

    n, killed, failures, other, orphans_gone, startup, nworkers = asyncio.run(body())
    assert other == []
    assert len(failures) == n
    latency = max(failures.values()) - killed
    FIGURES["engine SIGKILL"] = (
        f"{n} requests in flight (256 running), all failed "
        f"{min(failures.values()) - killed:.2f}-{latency:.2f} s after the kill; "
        f"{nworkers} compile workers gone {orphans_gone:.1f} s later; "
        f"new engine up in {startup:.1f} s"
    )
    assert latency < 2.0


def test_compile_workers_exit_when_the_engine_is_killed_mid_compile():
    """A worker busy with a long compile reads nothing from its pipe, so it would
    compile on, orphaned, for the whole grammar (80 s for this one here) after its
    engine died."""

    async def body():
        client = await EngineClient.spawn(
            EngineConfig(
                model="random", structured_output=StructuredOutputConfig(compile_timeout_s=300)
            )
        )
        try:
            await asyncio.to_thread(idle_workers, client.proc.pid, 2)
            task = asyncio.create_task(
                drain(
                    client,
                    EngineCoreRequest(
                        "slow",
                        PROMPT,
                        SamplingParams(max_tokens=4),
                        StructuredOutputSpec("json_schema", SLOW_SCHEMA),
                    ),
                )
            )
            busy = await asyncio.to_thread(busy_worker, client.proc.pid)
            os.kill(client.proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(EngineDeadError):
                await task
        finally:
            await client.shutdown(timeout_s=5)
        return busy, killed

    busy, killed = asyncio.run(body())
    wait_until(lambda: not alive(busy), 15, "the compiling worker exits")
    took = time.monotonic() - killed
    FIGURES["compiling worker after engine SIGKILL"] = f"gone {took:.1f} s after the kill"
