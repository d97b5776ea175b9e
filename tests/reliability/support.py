"""What the reliability tests share beside the engine harness (`tests.support.engine`):
a raw ZeroMQ peer that sends hand-made frames, background traffic that must finish
untouched, and the engine's resident memory."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import zmq

from engine_core.client import EngineClient, RequestOutput
from ipc import (
    PROTOCOL_VERSION,
    Codec,
    EngineCoreOutputs,
    EngineCoreRequest,
    ErrorNotice,
    FinishReason,
    Handshake,
    HealthReply,
    HealthRequest,
    Heartbeat,
    Hello,
    SamplingParams,
    StructuredOutputSpec,
    WireError,
)
from tests.support.engine import LoopThread
from tests.support.prompts import chat_prompt

PROMPT = chat_prompt()


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` (VmRSS, KiB)."""
    return _status_field(pid, "VmRSS")


def hwm_kib(pid: int) -> int:
    """Peak resident memory of process ``pid`` (VmHWM, KiB)."""
    return _status_field(pid, "VmHWM")


def _status_field(pid: int, name: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{name}:\s+(\d+) kB", text, re.M)
    assert m is not None, f"no {name} in /proc/{pid}/status"
    return int(m.group(1))


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# ----- a raw peer -----------------------------------------------------------------


class RawPeer:
    """A DEALER socket that sends whatever frames a test makes."""

    def __init__(self, address: str, *, rcvhwm: int | None = None) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if rcvhwm is not None:
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.connect(address)
        self.codec = Codec()
        self.sent = 0

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)
        self.sent += 1

    def send_msg(self, msg: Any) -> None:
        self.send(self.codec.encode(msg))

    def recv(self, timeout_s: float) -> Any | None:
        """The next message other than a heartbeat, or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                return None
            msg = self.codec.decode(self.sock.recv_multipart())
            if not isinstance(msg, Heartbeat):
                return msg

    def hello(self, timeout_s: float = 30.0) -> Handshake:
        self.send_msg(Hello(PROTOCOL_VERSION, "raw-peer"))
        while True:
            msg = self.recv(timeout_s)
            assert msg is not None, "no handshake"
            if isinstance(msg, Handshake):
                return msg

    def health(self, nonce: int, timeout_s: float = 60.0) -> tuple[HealthReply, list[Any]]:
        """Ask for health; returns the reply and every message received before it."""
        self.send_msg(HealthRequest(nonce))
        before: list[Any] = []
        while True:
            msg = self.recv(timeout_s)
            assert msg is not None, f"no health reply within {timeout_s} s; got {before[-5:]}"
            if isinstance(msg, HealthReply) and msg.nonce == nonce:
                return msg, before
            before.append(msg)

    def close(self) -> None:
        self.sock.close(linger=0)


def classify(frames: list[bytes]) -> Any:
    """What the engine should make of ``frames``: the decoded message, or the
    `WireError` it raises."""
    try:
        return Codec().decode(frames)
    except WireError as e:
        return e


# ----- well-formed traffic that must come through untouched ---------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        # no maxLength: xgrammar 0.2.9 lets a length-limited string hold raw control
        # characters (its rule is [^"\\\r\n]), which strict JSON parsers refuse
        "city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
REGEX = r"[A-Z]{2}-\d{3,5}"


@dataclass
class Outcome:
    request_id: str
    kind: str
    ids: list[int]
    final: RequestOutput | None
    finals: int
    error: BaseException | None = None


@dataclass
class Traffic:
    """Well-formed requests from a normal client, submitted in waves while a test does
    its damage elsewhere. Every one must end exactly once, the constrained ones
    validly."""

    client: EngineClient
    concurrency: int = 8
    max_tokens: int = 96
    prefix: str = "bg"
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def request(self, i: int) -> tuple[str, EngineCoreRequest]:
        rid = f"{self.prefix}-{i}"
        kind = ("schema", "regex", "free")[i % 3]
        sp = SamplingParams(max_tokens=self.max_tokens, seed=i)
        so = None
        if kind == "schema":
            so = StructuredOutputSpec("json_schema", json.dumps(SCHEMA))
        elif kind == "regex":
            so = StructuredOutputSpec("regex", REGEX)
        else:
            sp = SamplingParams(max_tokens=self.max_tokens // 4, seed=i, ignore_eos=True)
        return kind, EngineCoreRequest(rid, PROMPT, sp, so)

    async def run(self) -> list[Outcome]:
        counter = iter(range(10**9))

        async def lane() -> None:
            while not self._stop.is_set():
                i = next(counter)
                kind, req = self.request(i)
                self.outcomes.append(await _collect(self.client, req, kind))

        await asyncio.gather(*(lane() for _ in range(self.concurrency)))
        return self.outcomes

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.call_soon_threadsafe(self._stop.set)


@contextmanager
def background(
    loop: LoopThread, client: EngineClient, *, full_ok: bool = False, **kwargs: Any
) -> Iterator[Traffic]:
    """Well-formed traffic for the duration of the block; on leaving, waits for every
    request to end and checks them all (`check_outcomes`)."""
    traffic = Traffic(client, **kwargs)
    fut = loop.submit(traffic.run)
    ok = False
    try:
        yield traffic
        ok = True
    finally:
        traffic.stop(loop.loop)
        outcomes = fut.result(300)
        if ok:
            counts = check_outcomes(outcomes, client.tokenizer(), full_ok=full_ok)
            print(f"background: {len(outcomes)} well-formed requests, all ended once: {counts}")


async def _collect(client: EngineClient, req: EngineCoreRequest, kind: str) -> Outcome:
    ids: list[int] = []
    final = None
    finals = 0
    try:
        async for out in client.generate(req):
            ids += out.new_token_ids
            if out.finished:
                finals += 1
                final = out
    except Exception as e:  # noqa: BLE001 - recorded, and the check fails on it
        return Outcome(req.request_id, kind, ids, final, finals, e)
    return Outcome(req.request_id, kind, ids, final, finals)


def check_outcomes(
    outcomes: Sequence[Outcome], tokenizer, *, full_ok: bool = False
) -> dict[str, int]:
    """Every request ended exactly once, without an error (but, with ``full_ok``, the
    engine's "full, retry later"); every constrained one that stopped is valid.
    Returns counts by finish reason."""
    counts: dict[str, int] = {}
    for o in outcomes:
        assert o.error is None, f"{o.request_id}: {o.error!r}"
        assert o.finals == 1 and o.final is not None, f"{o.request_id}: {o.finals} finals"
        if (
            full_ok
            and o.final.finish_reason == FinishReason.ERROR
            and "engine is full" in (o.final.error or "")
        ):
            counts["refused: full"] = counts.get("refused: full", 0) + 1
            continue
        assert o.final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), (
            f"{o.request_id}: {o.final.finish_reason} {o.final.error}"
        )
        reason = str(o.final.finish_reason)
        counts[reason] = counts.get(reason, 0) + 1
        if o.final.finish_reason == FinishReason.STOP and o.kind != "free":
            text = tokenizer.decode(o.ids[:-1])
            if o.kind == "schema":
                jsonschema.validate(json.loads(text), SCHEMA)
            else:
                assert re.fullmatch(REGEX, text), text
    return counts


def outputs_of(messages: Sequence[Any]) -> list:
    """The `EngineCoreOutput` items among raw messages."""
    return [o for m in messages if isinstance(m, EngineCoreOutputs) for o in m.outputs]


def errors_of(messages: Sequence[Any]) -> list[ErrorNotice]:
    return [m for m in messages if isinstance(m, ErrorNotice)]
