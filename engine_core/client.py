"""The front end's side of the engine: spawn or connect, submit, stream, abort, stop.

An `EngineClient` lives on one asyncio loop. Its socket belongs to an IO thread,
which watches the connection: when the engine is gone, every request in flight fails
at once with `EngineDeadError`, and new requests are refused. Stop strings are
the front end's (`frontend.stop_strings`): it reads the outputs, and leaves the stream
at a stop string, which aborts the request here.

The engine is judged gone on evidence only: a spawned engine's process exited; the
connection closed and a new one was refused (nothing listens there any more), or did
not come back within ``reconnect_grace_s`` of this process's own running time; or
ZeroMQ's heartbeats went unanswered for ``engine_timeout_s`` (answered by the
engine's ZeroMQ threads, whatever its Python does: only a stopped engine, host or
network goes silent). A stall of this process (a long computation holding the GIL,
a SIGSTOP) is not evidence: heartbeats are answered by ZeroMQ's threads here too, and
grace periods run on this process's running time (`ipc.RunningClock`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from ipc import (
    DEFAULT_MAX_MESSAGE_BYTES,
    NOT_GREETED,
    PROTOCOL_VERSION,
    SHUTDOWN_REFUSED,
    AbortRequests,
    ClientKeys,
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
    connect_curve,
    load_client_keys,
    set_heartbeats,
)

from .config import EngineConfig
from .liveness import EVENTS as WATCHED_EVENTS
from .liveness import EngineWatch
from .spawning import start_engine

if TYPE_CHECKING:
    from tokenization import Tokenizer

log = logging.getLogger("thinkgate.client")

#: ZeroMQ's own PING to the engine this often (see `ipc.set_heartbeats`)
PING_S = 1.0
#: how often the IO thread looks at the engine's process and the connection
TICK_S = 0.05
#: the defaults of `EngineClient`'s liveness settings
ENGINE_TIMEOUT_S = 30.0
RECONNECT_GRACE_S = 2.0


class EngineDeadError(RuntimeError):
    """The engine process died or stopped answering; the request cannot finish."""


class EngineStartError(RuntimeError):
    """The engine did not come up (it exited, its handshake did not arrive in time, or
    the connection's own handshake failed)."""


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
    """A front end's connection to one engine.

    ``engine_timeout_s``: the connection closes when the engine answers no heartbeat
    for this long (a stopped engine or host, a lost network). ``reconnect_grace_s``:
    after the connection closes, how long (of this process's running time) a new one
    may take before the engine counts as gone; a refused one counts at once.
    ``curve``: keys for an engine that requires CURVE. ``shutdown_token``: the token
    that lets `shutdown` stop the engine (a spawning client makes one).
    """

    def __init__(
        self,
        address: str,
        *,
        proc: subprocess.Popen | None = None,
        own_dir: Path | None = None,
        engine_timeout_s: float = ENGINE_TIMEOUT_S,
        reconnect_grace_s: float = RECONNECT_GRACE_S,
        curve: ClientKeys | None = None,
        shutdown_token: str | None = None,
        load_tokenizer: bool = True,
    ) -> None:
        self.address = address
        self.proc = proc
        self._own_dir = own_dir
        self.engine_timeout_s = engine_timeout_s
        self.reconnect_grace_s = reconnect_grace_s
        self._curve = curve
        self._shutdown_token = shutdown_token
        self._load_tokenizer = load_tokenizer
        self.identity = uuid.uuid4().bytes
        self.handshake: Handshake | None = None
        self.dead_reason: str | None = None
        self._loop = asyncio.get_running_loop()
        self._codec_io = Codec()
        self._codec = Codec()
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._hello: asyncio.Future[Handshake] = self._loop.create_future()
        self._health: dict[int, asyncio.Future[HealthReply]] = {}
        self._refusals: list[str] = []
        #: HELLO said again and its handshake not yet back: a NOT_GREETED now answers a
        #: message sent before it, and forgets nothing more
        self._rehello = False
        self._nonce = itertools.count()
        self._closed = False
        self._tokenizer: Future[Tokenizer] | None = None
        # IO thread only: the state of the connection, and when it last told the engine
        # it is here (the engine answers a client it dropped with NOT_GREETED, which is
        # how one dropped while connected, for not reading its outputs, learns of it)
        self._beat = self._codec_io.encode(Heartbeat(0.0))
        self._last_beat = 0.0
        self._watch = EngineWatch(
            address,
            proc,
            reconnect_grace_s=reconnect_grace_s,
            tick_s=TICK_S,
            on_dead=self._die,
            on_back=lambda: self._loop.call_soon_threadsafe(self._reconnected),
            on_refused=lambda why: self._loop.call_soon_threadsafe(self._refused, why),
        )
        self._pump = SocketPump(
            self._make_socket,
            lambda sock: sock.connect(self.address),
            self._on_frames,
            on_tick=self._on_tick,
            monitor_events=WATCHED_EVENTS,
            on_event=self._on_event,
            max_parts=2,
            on_failure=self._on_io_failure,
            tick_s=TICK_S,
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
        engine_timeout_s: float = ENGINE_TIMEOUT_S,
        reconnect_grace_s: float = RECONNECT_GRACE_S,
        load_tokenizer: bool = True,
    ) -> EngineClient:
        """Start an engine process (on a private ipc:// socket unless the config names
        an address) and wait for its handshake. Only this client can stop it over the
        wire: it gives the engine a shutdown token (unless the config names a token
        file, whose token it then uses)."""
        sp = start_engine(config or EngineConfig())
        client = cls(
            sp.address,
            proc=sp.proc,
            own_dir=sp.own_dir,
            engine_timeout_s=engine_timeout_s,
            reconnect_grace_s=reconnect_grace_s,
            curve=sp.curve,
            shutdown_token=sp.shutdown_token,
            load_tokenizer=load_tokenizer,
        )
        try:
            await client._say_hello(startup_timeout_s)
        except BaseException:
            await client.shutdown(timeout_s=5)
            raise
        return client

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        timeout_s: float = 30.0,
        engine_timeout_s: float = ENGINE_TIMEOUT_S,
        reconnect_grace_s: float = RECONNECT_GRACE_S,
        curve_keys: str | os.PathLike[str] | ClientKeys | None = None,
        shutdown_token: str | None = None,
        load_tokenizer: bool = True,
    ) -> EngineClient:
        """Connect to a running engine and wait for its handshake. ``curve_keys``: a
        directory holding ``engine.key`` and ``client.key_secret`` (see `ipc.keys`),
        or the keys themselves, for an engine that requires CURVE."""
        curve = (
            curve_keys
            if isinstance(curve_keys, ClientKeys) or curve_keys is None
            else load_client_keys(curve_keys)
        )
        client = cls(
            address,
            engine_timeout_s=engine_timeout_s,
            reconnect_grace_s=reconnect_grace_s,
            curve=curve,
            shutdown_token=shutdown_token,
            load_tokenizer=load_tokenizer,
        )
        try:
            await client._say_hello(timeout_s)
        except BaseException:
            await client.close()
            raise
        return client

    async def _say_hello(self, timeout_s: float) -> None:
        self._send(Hello(PROTOCOL_VERSION, self.identity.hex()))
        deadline = self._loop.time() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineStartError(
                    f"the engine exited with code {self.proc.returncode} before its handshake"
                )
            try:
                self.handshake = await asyncio.wait_for(asyncio.shield(self._hello), 0.1)
                break
            except TimeoutError:
                if self._loop.time() > deadline:
                    raise EngineStartError(
                        f"no handshake from {self.address} within {timeout_s:g} s"
                    ) from None
        if self._load_tokenizer:
            self._start_tokenizer()

    def _make_socket(self, ctx: zmq.Context) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, DEFAULT_MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.LINGER, 0)
        set_heartbeats(sock, PING_S, self.engine_timeout_s)
        if self._curve is not None:
            connect_curve(sock, self._curve)
        return sock

    # ----- IO thread ----------------------------------------------------------------

    def _on_frames(self, frames: list[bytes]) -> None:
        try:
            msg = self._codec_io.decode(frames)
        except WireError as e:
            log.warning("bad frame from the engine: %s", e)
            return
        if isinstance(msg, Handshake):
            self._watch.greeted = True
        if not isinstance(msg, Heartbeat):
            self._loop.call_soon_threadsafe(self._dispatch, msg)

    def _on_event(self, event: int, endpoint: str) -> None:
        if not self._closed:
            self._watch.event(event, endpoint)

    def _on_tick(self) -> None:
        if not self._closed:
            self._watch.tick()
            now = time.monotonic()
            if self._watch.greeted and now - self._last_beat >= PING_S:
                self._last_beat = now
                self._pump.send(self._beat)

    def _on_io_failure(self, error: BaseException) -> None:
        self._watch.die(f"the client's IO thread failed: {error!r}")

    def _die(self, reason: str) -> None:
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
            self._rehello = False
            if not self._hello.done():
                self._hello.set_result(msg)
        elif isinstance(msg, HealthReply):
            f = self._health.pop(msg.nonce, None)
            if f is not None and not f.done():
                f.set_result(msg)
        elif isinstance(msg, ErrorNotice):
            if msg.message == NOT_GREETED and self._rehello:
                # an answer to what was sent before this client said HELLO again
                if msg.request_id is not None and msg.request_id in self._streams:
                    self._streams.pop(msg.request_id).put_nowait(
                        RequestOutput(
                            msg.request_id, [], FinishReason.ERROR, error=f"engine: {NOT_GREETED}"
                        )
                    )
            elif msg.message == NOT_GREETED and self._hello.done():
                self._forgotten(
                    "the engine dropped this client (silent past the engine's client timeout, "
                    "not reading its outputs, or over its message limit) and the request with it"
                )
            elif msg.message.startswith(SHUTDOWN_REFUSED):
                log.warning("engine: %s", msg.message)
                self._refusals.append(msg.message)
            elif msg.request_id is not None and msg.request_id in self._streams:
                self._streams[msg.request_id].put_nowait(
                    RequestOutput(msg.request_id, [], FinishReason.ERROR, error=msg.message)
                )
            elif not self._hello.done():
                self._hello.set_exception(EngineStartError(msg.message))
            else:
                log.warning("engine error: %s", msg.message)

    def _refused(self, why: str) -> None:
        if not self._hello.done():
            self._hello.set_exception(EngineStartError(why))

    def _reconnected(self) -> None:
        """The connection closed and came back: the engine lives, but what was in
        flight either way may be lost, and the engine may have dropped this client."""
        lost = list(self._streams)
        self._forgotten(
            "the connection to the engine was interrupted (the engine dropped this client, "
            "or messages were lost) and the request with it"
        )
        if lost:
            self._send(AbortRequests(lost))

    def _forgotten(self, error: str) -> None:
        """The engine no longer knows this client, or may not: it dropped it (silent
        past the engine's client timeout, say while this process was stopped, or not
        reading), and with it every request in flight. End each of their streams with
        an error, and say HELLO again so that new requests are served."""
        lost, self._streams = self._streams, {}
        for rid, q in lost.items():
            q.put_nowait(RequestOutput(rid, [], FinishReason.ERROR, error=error))
        log.warning("%s; %d requests lost; saying HELLO again", error, len(lost))
        self._rehello = True
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

    @property
    def longest_stall_s(self) -> float:
        """The longest time this client's IO thread could not run (this process was
        stopped, or its Python threads starved), in seconds: time not counted as the
        engine's silence."""
        return self._watch.clock.longest_stall_s

    def _start_tokenizer(self) -> Future[Tokenizer]:
        """Load the engine's tokenizer in a thread of its own, once per process and
        tokenizer. Loading a large vocabulary takes seconds and holds the GIL for
        stretches, so it starts at the handshake (before requests are in flight)
        rather than on first use; liveness does not depend on this process's Python
        threads running meanwhile."""
        if self._tokenizer is None:
            assert self.handshake is not None
            self._tokenizer = _load_in_background(self.handshake)
        return self._tokenizer

    def tokenizer(self) -> Tokenizer:
        """The engine's tokenizer, as its handshake names it (loaded once, in the
        background from the handshake on; this waits for it)."""
        return self._start_tokenizer().result()

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
        size = len(frames[0]) + len(frames[1])
        if size > DEFAULT_MAX_MESSAGE_BYTES:
            # the engine would drop the message and this client, and with it every
            # other stream's outputs in flight; refuse here instead
            raise ValueError(
                f"request {rid!r} encodes to {size} bytes, over the engine's message "
                f"limit of {DEFAULT_MAX_MESSAGE_BYTES}"
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
        """Stop the engine if this client holds its shutdown token (a spawned engine;
        a spawned one is terminated, then killed, if it lingers), else leave it.
        Raises RuntimeError if a connected engine refuses the token."""
        if self.proc is None and self._shutdown_token is None:
            await self.close()
            return
        live = self.dead_reason is None and not self._closed and self.handshake is not None
        if live and (self.proc is None or self.proc.poll() is None):
            self._send(Shutdown("client shutdown", self._shutdown_token or ""))
        if self.proc is None:
            deadline = self._loop.time() + timeout_s
            while live and self.dead_reason is None and not self._refusals:
                if self._loop.time() > deadline:
                    break
                await asyncio.sleep(0.05)
            refused = list(self._refusals)
            await self._close_pump()
            if refused:
                raise RuntimeError(f"the engine did not stop: {refused[0]}")
            return
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


_TOKENIZERS: dict[tuple[str, tuple[str, ...], int], Future[Tokenizer]] = {}
_TOKENIZERS_LOCK = threading.Lock()


def _load_in_background(hs: Handshake) -> Future[Tokenizer]:
    """The tokenizer a handshake names, loading in a daemon thread (shared by every
    client of this process that names the same one)."""
    key = (hs.tokenizer, tuple(hs.extra_special_tokens), hs.vocab_rows)
    with _TOKENIZERS_LOCK:
        fut = _TOKENIZERS.get(key)
        if fut is not None and not (fut.done() and fut.exception() is not None):
            return fut
        fut = _TOKENIZERS[key] = Future()

    def load() -> None:
        from tokenization import load_tokenizer

        try:
            tok = load_tokenizer(hs.tokenizer, hs.extra_special_tokens)
            fut.set_result(tok.with_vocab_rows(hs.vocab_rows))
        except BaseException as e:  # raised by tokenizer(), where it is needed
            fut.set_exception(e)

    threading.Thread(target=load, name="thinkgate-tokenizer", daemon=True).start()
    return fut


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
