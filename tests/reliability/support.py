"""What the reliability tests share beside the engine harness (`tests.support.engine`):
a raw ZeroMQ peer that sends hand-made frames, background traffic that must finish
untouched, the engine's resident memory and its compile workers, and the engine the
fault tests serve."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
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
from tests.support.engine import LoopThread, Served
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


def wait_until(
    cond: Callable[[], object], timeout_s: float, what: str, step: float = 0.05
) -> float:
    """Poll ``cond`` until it is true; the seconds it took (fails after ``timeout_s``)."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(step)
    return time.monotonic() - t0


def figures_report(title: str, figures: dict[str, object]):
    """A module's autouse fixture that prints the figures its tests measured, at its end
    (``report = figures_report("faults", FIGURES)``)."""

    @pytest.fixture(scope="module", autouse=True)
    def report():
        yield
        if figures:
            print(f"\n{title}:", figures)

    return report


# ----- compile workers --------------------------------------------------------------


def compile_workers(engine_pid: int) -> list[int]:
    """The engine's compile worker processes."""
    return [p for p in children(engine_pid) if b"compile_worker" in _read(f"/proc/{p}/cmdline")]


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return b""


def cpu_ticks(pid: int) -> int:
    """CPU time of ``pid`` so far, in clock ticks (0 once it is gone)."""
    fields = _read(f"/proc/{pid}/stat").decode().rsplit(")", 1)[-1].split()
    return int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0


def idle_workers(engine_pid: int, n: int, log=None, timeout_s: float = 120) -> list[int]:
    """Wait until the engine has ``n`` compile workers, all ready (when its log is
    given: the engine logs each worker it has started) and idle."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = compile_workers(engine_pid)
        ready = ready_workers(log()) if log else set(workers)
        if len(workers) == n and set(workers) <= ready:
            t0 = {p: cpu_ticks(p) for p in workers}
            time.sleep(0.5)
            if all(cpu_ticks(p) - t0[p] <= 1 for p in workers):
                return workers
        else:
            time.sleep(0.2)
    raise AssertionError(f"no {n} idle compile workers within {timeout_s} s")


def busy_worker(engine_pid: int, timeout_s: float = 60, exclude: set[int] = frozenset()) -> int:
    """The compile worker that is compiling: busy on the CPU in two half-second
    windows in a row (a worker just started, or just done, is busy only briefly)."""
    deadline = time.monotonic() + timeout_s
    last: int | None = None
    while time.monotonic() < deadline:
        t0 = {p: cpu_ticks(p) for p in compile_workers(engine_pid) if p not in exclude}
        time.sleep(0.5)
        delta = {p: cpu_ticks(p) - t for p, t in t0.items()}
        busy = max(delta, key=lambda p: delta[p]) if delta and max(delta.values()) >= 5 else None
        if busy is not None and busy == last:
            return busy
        last = busy
    raise AssertionError("no compile worker got busy")


def ready_workers(log: str) -> set[int]:
    """The compile workers the engine's log says are ready."""
    return set(map(int, re.findall(r"compile worker (\d+) is ready", log)))


#: a schema that takes xgrammar tens of seconds to compile on this machine
SLOW_SCHEMA = json.dumps(
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2500)}}
)
#: one that takes a few seconds to compile (2.5 s here when the machine is quiet), and
#: not too much to send back (52 MB serialized)
MEDIUM_SCHEMA = json.dumps({"enum": [f"member-{i}" for i in range(20_000)]})


# ----- the engine the fault tests serve, as an operator serves it -------------------

CLIENT_TIMEOUT_S = 2.0
MAX_WAITING = 200
CLIENT_BACKLOG = 1000
#: a forward pass that sleeps (as a real one waits on its device): the engine idles
#: between steps, so background traffic costs the machine little CPU while a test
#: waits on what it broke
PACED = ("--forward-ms", "5")
FAULTS_ENGINE_ARGS = (
    "--model",
    "random",
    "--max-num-seqs",
    "128",
    "--client-timeout-s",
    str(CLIENT_TIMEOUT_S),
    "--max-waiting",
    str(MAX_WAITING),
    "--client-backlog",
    str(CLIENT_BACKLOG),
    "--compile-timeout-s",
    "120",
    "--seed",
    "21",
)


def assert_nothing_left(served: Served, name: str) -> None:
    """After a test on a shared engine: no request, guide or compile is left."""

    async def settled():
        for _ in range(200):
            h = await served.client.health()
            if not (h.num_requests or h.num_guides or h.num_compiling):
                return h
            await asyncio.sleep(0.05)
        return h

    h = served.run(settled, 60)
    print(f"[{name}: engine RSS {rss_kib(served.engine.pid) / 1024:.0f} MiB after]")
    assert (h.num_requests, h.num_guides, h.num_compiling) == (0, 0, 0), h


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


async def drain(client: EngineClient, req: EngineCoreRequest) -> RequestOutput | None:
    """Run one request to its end; its last output."""
    last = None
    async for out in client.generate(req):
        last = out
    return last


def outputs_of(messages: Sequence[Any]) -> list:
    """The `EngineCoreOutput` items among raw messages."""
    return [o for m in messages if isinstance(m, EngineCoreOutputs) for o in m.outputs]


def errors_of(messages: Sequence[Any]) -> list[ErrorNotice]:
    return [m for m in messages if isinstance(m, ErrorNotice)]
