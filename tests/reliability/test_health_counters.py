"""The health reply's counters of what the engine still holds: wire-compatible with
peers that know only the first four fields, and true of a live engine."""

from __future__ import annotations

import asyncio
import json

import msgspec

from engine_core.client import EngineClient
from engine_core.config import EngineConfig
from ipc import (
    Codec,
    EngineCoreRequest,
    FinishReason,
    HealthReply,
    SamplingParams,
    StructuredOutputSpec,
)
from tests.support.engine import NO_WORKERS

from .support import PROMPT


class _OldHealthReply(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """HealthReply as peers of the first protocol version know it."""

    nonce: int
    num_running: int
    num_waiting: int
    num_steps: int


def test_old_and_new_peers_read_each_others_replies():
    new = HealthReply(
        5,
        1,
        2,
        3,
        num_requests=4,
        num_guides=5,
        num_compiling=6,
        num_cached_grammars=7,
        num_clients=8,
    )
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(new), type=_OldHealthReply)
    assert (old.nonce, old.num_running, old.num_waiting, old.num_steps) == (5, 1, 2, 3)
    back = Codec().decode([bytes([19]), msgspec.msgpack.encode(_OldHealthReply(5, 1, 2, 3))])
    assert back == HealthReply(5, 1, 2, 3)
    assert back.num_requests == back.num_guides == back.num_compiling == 0


def test_counters_follow_the_work():
    schema = json.dumps(
        {
            "type": "object",
            "properties": {f"q{i}": {"type": "string"} for i in range(400)},
        }  # seconds to compile: still compiling when aborted
    )

    async def body():
        client = await EngineClient.spawn(
            EngineConfig(model="random", max_num_seqs=8, seed=1, structured_output=NO_WORKERS)
        )
        try:
            idle = await client.health()
            long = asyncio.create_task(
                _drain(
                    client,
                    EngineCoreRequest(
                        "long",
                        PROMPT,
                        SamplingParams(max_tokens=10_000, ignore_eos=True),
                        StructuredOutputSpec("regex", "[a-z]{1,20000}"),
                    ),
                )
            )
            compiling = asyncio.create_task(
                _drain(
                    client,
                    EngineCoreRequest(
                        "compiling",
                        PROMPT,
                        SamplingParams(max_tokens=4),
                        StructuredOutputSpec("json_schema", schema),
                    ),
                )
            )
            busy = await client.health()
            while busy.num_guides < 1:
                busy = await client.health()
                await asyncio.sleep(0.02)
            await client.abort(["long", "compiling"])
            ends = await asyncio.gather(long, compiling)
            after = await client.health()
            while after.num_compiling or after.num_guides:  # a started compile runs on
                await asyncio.sleep(0.05)
                after = await client.health()
            return idle, busy, ends, after
        finally:
            await client.shutdown()

    idle, busy, ends, after = asyncio.run(body())
    assert (idle.num_requests, idle.num_guides, idle.num_compiling, idle.num_clients) == (
        0,
        0,
        0,
        1,
    )
    assert busy.num_requests == 2 and busy.num_guides >= 1
    assert all(e.finish_reason == FinishReason.ABORT for e in ends), ends
    assert (after.num_requests, after.num_guides, after.num_compiling, after.num_running) == (
        0,
        0,
        0,
        0,
    )
    assert after.num_cached_grammars >= 1


async def _drain(client, req):
    last = None
    async for out in client.generate(req):
        last = out
    return last
