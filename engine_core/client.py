"""The front end's side of the engine: spawn or connect, submit, stream, abort, stop.

An `EngineClient` lives on one asyncio loop. Its socket belongs to an IO thread,
which also sends heartbeats and watches the engine: when the engine process dies
(or a connected engine falls silent), every request in flight fails at once with
`EngineDeadError`, and new requests are refused. Stop strings are the front end's
(`frontend.response`): it reads the outputs, and leaves the stream at a stop string,
which aborts the request here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from ipc import (
    DEFAULT_MAX_FRAME_BYTES,
    NOT_GREETED,
    PROTOCOL_VERSION,
    AbortRequests,
    Codec,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    ErrorNotice,
    FinishReason,
    Goodbye,
    Handshake,
    HealthReply,
    HealthRequest,
    Heartbeat,
    Hello,
    Shutdown,
    SocketPump,
    TokenLogprobs,
    WireError,
    private_ipc_address,
)

from .config import EngineConfig

if TYPE_CHECKING:
    from tokenization import Tokenizer

log = logging.getLogger("thinkgate.client")

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
HEARTBEAT_S = 0.5


class EngineDeadError(RuntimeError):
    """The engine process died or stopped answering; the request cannot finish."""


class EngineStartError(RuntimeError):
    """The engine did not come up (it exited, or its handshake did not arrive in time)."""


@dataclass(slots=True)
class RequestOutput:
    """One piece of a request's output, as the client yields it."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    #: the stop token id that ended the request
    stop_reason: int | None = None
    error: str | None = None
    num_reasoning_tokens: int = 0
    #: of ``new_token_ids``, when the request asked for them
    logprobs: TokenLogprobs | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineClient:
    def __init__(
        self,
        address: str,
        *,
        proc: subprocess.Popen | None = None,
        own_dir: Path | None = None,
        engine_timeout_s: float = 5.0,
    ) -> None:
        self.address = address
        self.proc = proc
        self._own_dir = own_dir
        self.engine_timeout_s = engine_timeout_s
        self.identity = uuid.uuid4().bytes
        self.handshake: Handshake | None = None
        self.dead_reason: str | None = None
        self._loop = asyncio.get_running_loop()
        self._codec_io = Codec()
        self._codec = Codec()
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._hello: asyncio.Future[Handshake] = self._loop.create_future()
        self._health: dict[int, asyncio.Future[HealthReply]] = {}
        self._nonce = itertools.count()
        self._last_seen = time.monotonic()
        self._last_beat = 0.0
        self._closed = False
        self._tokenizer: Tokenizer | None = None
        self._pump = SocketPump(
            self._make_socket,
            self._on_frames,
            on_tick=self._on_tick,
            tick_s=0.05,
            name="thinkgate-client-io",
        )
        self._pump.start()

    # ----- construction -------------------------------------------------------------

    @classmethod
    async def spawn(
        cls,
        config: EngineConfig | None = None,
        *,
        startup_timeout_s: float = 180.0,
        engine_timeout_s: float = 5.0,
    ) -> EngineClient:
        """Start an engine process (on a private ipc:// socket unless the config names
        an address) and wait for its handshake."""
        config = config or EngineConfig()
        own_dir = None
        address = config.address
        if address is None:
            address, own_dir = private_ipc_address()
        args = [a for a in config.to_args()]
        if config.address is None:
            args += ["--address", address]
        args += ["--parent-pid", str(os.getpid())]
        env = dict(os.environ)
        env["PYTHONPATH"] = _PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine_core", *args], env=env, stdout=subprocess.DEVNULL
        )
        client = cls(address, proc=proc, own_dir=own_dir, engine_timeout_s=engine_timeout_s)
        try:
            await client._say_hello(startup_timeout_s)
        except BaseException:
            await client.shutdown(timeout_s=5)
            raise
        return client

    @classmethod
    async def connect(
        cls, address: str, *, timeout_s: float = 30.0, engine_timeout_s: float = 5.0
    ) -> EngineClient:
        """Connect to a running engine and wait for its handshake."""
        client = cls(address, engine_timeout_s=engine_timeout_s)
        try:
            await client._say_hello(timeout_s)
        except BaseException:
            await client.close()
            raise
        return client

    async def _say_hello(self, timeout_s: float) -> None:
        self._send(Hello(PROTOCOL_VERSION, self.identity.hex()))
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineStartError(
                    f"the engine exited with code {self.proc.returncode} before its handshake"
                )
            try:
                self.handshake = await asyncio.wait_for(asyncio.shield(self._hello), 0.1)
                self._last_seen = time.monotonic()
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise EngineStartError(
                        f"no handshake from {self.address} within {timeout_s:g} s"
                    ) from None

    def _make_socket(self, ctx: zmq.Context) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, DEFAULT_MAX_FRAME_BYTES)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        return sock

    # ----- IO thread ----------------------------------------------------------------

    def _on_frames(self, frames: list[bytes]) -> None:
        try:
            msg = self._codec_io.decode(frames)
        except WireError as e:
            log.warning("bad frame from the engine: %s", e)
            return
        self._last_seen = time.monotonic()
        if not isinstance(msg, Heartbeat):
            self._loop.call_soon_threadsafe(self._dispatch, msg)

    def _on_tick(self) -> None:
        now = time.monotonic()
        if self.dead_reason is not None or self._closed:
            return
        if now - self._last_beat >= HEARTBEAT_S and self.handshake is not None:
            self._last_beat = now
            self._pump.send(self._codec_io.encode(Heartbeat(time.time())))  # this thread's codec
        reason = None
        if self.proc is not None and self.proc.poll() is not None:
            reason = f"the engine process exited with code {self.proc.returncode}"
        elif self.handshake is not None and now - self._last_seen > self.engine_timeout_s:
            reason = f"the engine sent nothing for {self.engine_timeout_s:g} s"
        if reason is not None:
            self.dead_reason = reason
            self._loop.call_soon_threadsafe(self._fail_all, reason)

    # ----- loop thread --------------------------------------------------------------

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, EngineCoreOutputs):
            for o in msg.outputs:
                q = self._streams.get(o.request_id)
                if q is not None:
                    q.put_nowait(_to_output(o))
        elif isinstance(msg, Handshake):
            if not self._hello.done():
                self._hello.set_result(msg)
        elif isinstance(msg, HealthReply):
            f = self._health.pop(msg.nonce, None)
            if f is not None and not f.done():
                f.set_result(msg)
        elif isinstance(msg, ErrorNotice):
            if msg.message == NOT_GREETED and self._hello.done():
                self._forgotten()
            elif msg.request_id is not None and msg.request_id in self._streams:
                self._streams[msg.request_id].put_nowait(
                    RequestOutput(msg.request_id, [], FinishReason.ERROR, error=msg.message)
                )
            elif not self._hello.done():
                self._hello.set_exception(EngineStartError(msg.message))
            else:
                log.warning("engine error: %s", msg.message)

    def _forgotten(self) -> None:
        """The engine no longer knows this client: it dropped it (silent past the
        engine's client timeout, say while this process was stopped, or not reading),
        and with it every request in flight. End each of their streams with an error,
        and say HELLO again so that new requests are served."""
        lost, self._streams = self._streams, {}
        for rid, q in lost.items():
            q.put_nowait(
                RequestOutput(
                    rid,
                    [],
                    FinishReason.ERROR,
                    error=(
                        "the engine dropped this client (silent past the engine's client timeout, "
                        "or "
                        "not reading its outputs) and the request with it"
                    ),
                )
            )
        log.warning(
            "the engine dropped this client; %d requests lost; saying HELLO again", len(lost)
        )
        self._send(Hello(PROTOCOL_VERSION, self.identity.hex()))

    def _fail_all(self, reason: str) -> None:
        err = EngineDeadError(reason)
        for q in self._streams.values():
            q.put_nowait(err)
        for f in self._health.values():
            if not f.done():
                f.set_exception(err)
        self._health.clear()
        if not self._hello.done():
            self._hello.set_exception(EngineStartError(reason))

    def _send(self, msg) -> None:
        self._pump.send(self._codec.encode(msg))

    # ----- public API -----------------------------------------------------------------

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    def tokenizer(self) -> Tokenizer:
        """The engine's tokenizer, as its handshake names it (loaded once)."""
        if self._tokenizer is None:
            from tokenization import load_tokenizer

            assert self.handshake is not None
            tok = load_tokenizer(self.handshake.tokenizer, self.handshake.extra_special_tokens)
            self._tokenizer = tok.with_vocab_rows(self.handshake.vocab_rows)
        return self._tokenizer

    async def generate(self, request: EngineCoreRequest) -> AsyncIterator[RequestOutput]:
        """Submit ``request`` and yield its outputs as they arrive; the last one has a
        finish reason. Raises `EngineDeadError` if the engine dies meanwhile. Leaving
        the loop early aborts the request in the engine."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        if self._closed:
            raise RuntimeError("the client is closed")
        rid = request.request_id
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in flight")
        frames = self._codec.encode(request)
        if len(frames[1]) > DEFAULT_MAX_FRAME_BYTES:
            # the engine's socket would drop the connection, and with it every other
            # stream's outputs in flight; refuse here instead
            raise ValueError(
                f"request {rid!r} encodes to {len(frames[1])} bytes, over the "
                f"engine's frame limit of {DEFAULT_MAX_FRAME_BYTES}"
            )
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[rid] = q
        finished = False
        self._pump.send(frames)
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished and self.dead_reason is None and not self._closed:
                self._send(AbortRequests([rid]))

    async def abort(self, request_ids: str | Sequence[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self._send(AbortRequests(ids))

    async def health(self, timeout_s: float = 5.0) -> HealthReply:
        """A round trip through the engine's busy loop."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        nonce = next(self._nonce)
        f: asyncio.Future[HealthReply] = self._loop.create_future()
        self._health[nonce] = f
        self._send(HealthRequest(nonce))
        try:
            return await asyncio.wait_for(f, timeout_s)
        finally:
            self._health.pop(nonce, None)

    async def close(self) -> None:
        """Leave a connected engine (its requests from this client are dropped)."""
        if self._closed:
            return
        if self.dead_reason is None and self.handshake is not None:
            self._send(Goodbye("client closed"))
        await self._close_pump()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop a spawned engine (then kill it if it lingers), or leave a connected one."""
        if self.proc is None:
            await self.close()
            return
        if self.proc.poll() is None and self.dead_reason is None and not self._closed:
            self._send(Shutdown("client shutdown"))
        try:
            await asyncio.to_thread(self.proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        await self._close_pump()

    async def _close_pump(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._pump.close)
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()


def _to_output(o: EngineCoreOutput) -> RequestOutput:
    return RequestOutput(
        o.request_id,
        o.new_token_ids,
        o.finish_reason,
        o.stop_reason,
        o.error,
        o.num_reasoning_tokens,
        o.logprobs,
    )
