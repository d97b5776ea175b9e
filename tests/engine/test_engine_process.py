"""The engine process, end to end through real ZeroMQ sockets: handshake, batching,
abort, seeds, bad frames, and a death under load."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import msgspec
import pytest
import zmq

from engine_core.client import EngineClient, EngineDeadError
from engine_core.config import EngineConfig
from ipc import (
    PROTOCOL_VERSION,
    Codec,
    EngineCoreRequest,
    ErrorNotice,
    FinishReason,
    HealthReply,
    HealthRequest,
    Hello,
    MsgType,
    SamplingParams,
    StructuredOutputSpec,
)
from tests.support.engine import NO_WORKERS, EngineHarness, collect
from tests.support.prompts import chat_prompt

PROMPT = chat_prompt()


@pytest.fixture(scope="module")
def engine():
    h = EngineHarness(EngineConfig(model="random", max_num_seqs=64, structured_output=NO_WORKERS))
    yield h
    h.close()


def test_handshake(engine):
    hs = engine.client.handshake
    assert hs is not None
    assert hs.protocol_version == PROTOCOL_VERSION
    assert hs.vocab_rows == 151_936
    assert hs.tokenizer == "qwen3"
    assert hs.max_num_seqs == 64
    assert engine.client.proc is not None and hs.engine_pid == engine.client.proc.pid


def test_200_concurrent_requests_each_end_once(engine):
    rng = random.Random(7)
    budgets = [rng.randint(1, 40) for _ in range(200)]

    async def body():
        reqs = [
            EngineCoreRequest(
                f"c{i}", PROMPT, SamplingParams(max_tokens=m, seed=i, ignore_eos=True)
            )
            for i, m in enumerate(budgets)
        ]
        return await asyncio.gather(*(collect(engine.client, r) for r in reqs))

    results = engine.run(body)
    for (ids, final, finals), m in zip(results, budgets, strict=True):
        assert finals == 1
        assert final.finish_reason == FinishReason.LENGTH
        assert len(ids) == m


def test_same_seed_same_tokens(engine):
    async def body():
        sp = SamplingParams(max_tokens=30, seed=1234, temperature=0.8, top_p=0.9, ignore_eos=True)
        a = collect(engine.client, EngineCoreRequest("s1", PROMPT, sp))
        b = collect(engine.client, EngineCoreRequest("s2", PROMPT, sp))
        # a third request in the same batch, with another seed, must not disturb them
        c = collect(
            engine.client, EngineCoreRequest("s3", PROMPT, msgspec.structs.replace(sp, seed=99))
        )
        return await asyncio.gather(a, b, c)

    (a, _, _), (b, _, _), (c, _, _) = engine.run(body)
    assert a == b
    assert a != c
    (d, _, _) = engine.run(
        lambda: collect(
            engine.client,
            EngineCoreRequest(
                "s4",
                PROMPT,
                SamplingParams(
                    max_tokens=30, seed=1234, temperature=0.8, top_p=0.9, ignore_eos=True
                ),
            ),
        )
    )
    assert d == a


def test_abort_mid_stream(engine):
    async def body():
        req = EngineCoreRequest("ab1", PROMPT, SamplingParams(max_tokens=10_000, ignore_eos=True))
        seen = []
        async for out in engine.client.generate(req):
            seen.append(out)
            if len(seen) == 3:
                await engine.client.abort("ab1")
            if out.finished:
                break
        return seen

    seen = engine.run(body)
    assert seen[-1].finish_reason == FinishReason.ABORT
    assert sum(o.finished for o in seen) == 1
    assert len(seen) < 1000

    async def after():
        return await engine.client.health()

    assert engine.run(after).num_running == 0


def test_leaving_the_stream_aborts_the_request(engine):
    async def body():
        req = EngineCoreRequest("ab2", PROMPT, SamplingParams(max_tokens=10_000, ignore_eos=True))
        n = 0
        async for _ in engine.client.generate(req):
            n += 1
            if n == 2:
                break
        for _ in range(100):
            h = await engine.client.health()
            if h.num_running == 0:
                return h
            await asyncio.sleep(0.05)
        return h

    assert engine.run(body).num_running == 0


def test_bad_requests_get_an_error_each(engine):
    cases = {
        "empty": EngineCoreRequest("b1", []),
        "range": EngineCoreRequest("b2", [10**9]),
        "max_tokens": EngineCoreRequest("b3", PROMPT, SamplingParams(max_tokens=0)),
        "top_p": EngineCoreRequest("b4", PROMPT, SamplingParams(top_p=0.0)),
        "kind": EngineCoreRequest(
            "b5", PROMPT, structured_output=StructuredOutputSpec("yaml", "x")
        ),
    }

    async def body():
        return {k: await collect(engine.client, r) for k, r in cases.items()}

    res = engine.run(body)
    for name, (_, final, finals) in res.items():
        assert finals == 1, name
        assert final.finish_reason == FinishReason.ERROR, name
        assert final.error, name
    assert "yaml" in res["kind"][1].error and "json_schema" in res["kind"][1].error


def _raw_dealer(address: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(address)
    return sock


def test_malformed_frames_and_wrong_protocol_leave_the_engine_serving(engine):
    codec = Codec()
    sock = _raw_dealer(engine.client.address)
    try:
        sock.send_multipart(
            [bytes([MsgType.HELLO]), msgspec.msgpack.encode(Hello(PROTOCOL_VERSION + 7, "x"))]
        )
        reply = codec.decode(sock.recv_multipart())
        assert isinstance(reply, ErrorNotice) and "protocol version" in reply.message
        sock.send_multipart(codec.encode(Hello(PROTOCOL_VERSION, "raw")))
        codec.decode(sock.recv_multipart())  # the handshake
        bad = [
            [b"\x02", b"\xc1garbage"],
            [b"\xff", b"{}"],
            [b"\x02"],
            [b"\x02", msgspec.msgpack.encode(["r", "not a list"])],
            [b"\x02\x03", b""],
            [
                bytes([MsgType.REQUEST]),
                msgspec.msgpack.encode(["r", [1, 2], {"temperature": "hot"}]),
            ],
        ]
        for frames in bad:
            sock.send_multipart(frames)
            reply = codec.decode(sock.recv_multipart())
            assert isinstance(reply, ErrorNotice), frames
        # a request id that can still be read is named in the error
        sock.send_multipart([bytes([MsgType.REQUEST]), msgspec.msgpack.encode(["rid-7", "oops"])])
        reply = codec.decode(sock.recv_multipart())
        assert isinstance(reply, ErrorNotice) and reply.request_id == "rid-7"
        sock.send_multipart(codec.encode(HealthRequest(5)))
        while True:
            reply = codec.decode(sock.recv_multipart())
            if isinstance(reply, HealthReply):
                break
        assert reply.nonce == 5
    finally:
        sock.close()

    async def ok():
        return await collect(
            engine.client,
            EngineCoreRequest("after-bad", PROMPT, SamplingParams(max_tokens=5, ignore_eos=True)),
        )

    ids, final, _ = engine.run(ok)
    assert final.finish_reason == FinishReason.LENGTH and len(ids) == 5


def test_frames_from_a_client_that_said_no_hello_are_refused(engine):
    codec = Codec()
    sock = _raw_dealer(engine.client.address)
    try:
        sock.send_multipart(codec.encode(EngineCoreRequest("nohello", PROMPT)))
        reply = codec.decode(sock.recv_multipart())
        assert isinstance(reply, ErrorNotice) and reply.request_id == "nohello"
    finally:
        sock.close()


def test_killed_engine_fails_every_request_within_2s():
    async def body():
        client = await EngineClient.spawn(
            EngineConfig(
                model="random",
                runner_options={"forward_ms": 20},
                structured_output=NO_WORKERS,
            )
        )
        try:
            reqs = [
                EngineCoreRequest(
                    f"k{i}", PROMPT, SamplingParams(max_tokens=30_000, ignore_eos=True)
                )
                for i in range(20)
            ]
            failures: list[float] = []

            async def run(r):
                try:
                    async for _ in client.generate(r):
                        pass
                except EngineDeadError:
                    failures.append(time.monotonic())

            tasks = [asyncio.create_task(run(r)) for r in reqs]
            await asyncio.sleep(1.5)
            killed = time.monotonic()
            os.kill(client.proc.pid, signal.SIGKILL)
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
            with pytest.raises(EngineDeadError):
                async for _ in client.generate(EngineCoreRequest("late", PROMPT)):
                    pass
            return killed, failures
        finally:
            await client.shutdown(timeout_s=2)

    killed, failures = asyncio.run(body())
    assert len(failures) == 20
    assert max(failures) - killed < 2.0


def test_sigterm_gives_every_request_a_final_output():
    async def body():
        client = await EngineClient.spawn(
            EngineConfig(
                model="random",
                runner_options={"forward_ms": 20},
                structured_output=NO_WORKERS,
            )
        )
        try:
            reqs = [
                EngineCoreRequest(
                    f"t{i}", PROMPT, SamplingParams(max_tokens=30_000, ignore_eos=True)
                )
                for i in range(5)
            ]
            tasks = [asyncio.create_task(collect(client, r)) for r in reqs]
            while (await client.health()).num_running < len(reqs):  # the core is up and busy
                await asyncio.sleep(0.05)
            client.proc.send_signal(signal.SIGTERM)
            return await asyncio.wait_for(asyncio.gather(*tasks), 20), await asyncio.to_thread(
                client.proc.wait, 20
            )
        finally:
            await client.shutdown(timeout_s=2)

    results, code = asyncio.run(body())
    for _, final, finals in results:
        assert finals == 1
        assert final.finish_reason == FinishReason.ABORT and "shut down" in final.error
    assert code == 0
