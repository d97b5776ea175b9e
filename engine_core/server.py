"""The engine-core process: sockets, the IO thread, and the busy loop around `EngineCore`."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
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
    Goodbye,
    Handshake,
    HealthReply,
    HealthRequest,
    Heartbeat,
    Hello,
    Shutdown,
    SocketPump,
    WireError,
    check_bind_address,
    private_ipc_address,
)
from reasoning import load_plugin
from tokenization import Tokenizer, load_tokenizer

from .config import EngineConfig

if TYPE_CHECKING:
    from .engine import EngineCore as Core

log = logging.getLogger("thinkgate.engine")

HEARTBEAT_S = 0.5


class _ClientGone:
    __slots__ = ()


class _Wake:
    __slots__ = ()


CLIENT_GONE = _ClientGone()
WAKE = _Wake()


class EngineServer:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.reasoning_parser_plugin:
            load_plugin(config.reasoning_parser_plugin)
        self._own_dir: Path | None = None
        if config.address:
            self.address = config.address
            check_bind_address(self.address, allow_remote=config.allow_remote)
        else:
            self.address, self._own_dir = private_ipc_address()
        t0 = time.perf_counter()
        tokenizer = load_tokenizer(config.resolved_tokenizer(), config.extra_special_tokens)
        self.inbox: queue.SimpleQueue[tuple[bytes, object]] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self._codec_main = Codec()
        self._codec_io = Codec()
        self._clients: dict[bytes, float] = {}  # IO thread only: last frame time
        self._pending: list[tuple[bytes, EngineCoreOutput]] = []  # main thread: outputs to send
        self._last_beat = 0.0
        self.pump = SocketPump(
            self._make_socket,
            self._on_frames,
            on_tick=self._on_tick,
            on_disconnect=self._on_disconnect,
            on_undeliverable=self._on_undeliverable,
            tick_s=0.1,
            name="thinkgate-engine-io",
        )
        # A model that keeps the tokenizer's rows (not a model directory) lets the
        # handshake go out before the core is built: the socket answers it (and queues
        # requests) while torch, xgrammar and the model load.
        early = not Path(config.model).is_dir()
        self.core: Core | None = None  # the IO thread answers health checks until it is set
        self._queued = 0  # requests the IO thread queued before the core was built
        if early:
            if threading.current_thread() is threading.main_thread():
                # clients may send work from now on: a stop while loading ends it cleanly
                signal.signal(signal.SIGTERM, lambda *_: self.stop())
                signal.signal(signal.SIGINT, lambda *_: self.stop())
            self.handshake = self._handshake(config, tokenizer.vocab_rows, config.resolved_device())
            self.pump.start()
            log.info("handshake ready in %.2f s; loading the engine core", time.perf_counter() - t0)
        try:
            self.core = (EngineCore or _engine_core_class())(config, tokenizer)
        except BaseException:
            if early:
                self.pump.close()
            if self._own_dir is not None:
                shutil.rmtree(self._own_dir, ignore_errors=True)
            raise
        if not early:
            self.handshake = self._handshake(config, self.core.vocab_rows, self.core.device)
            self.pump.start()
        elif self.core.vocab_rows != self.handshake.vocab_rows:
            raise RuntimeError(
                f"the model has {self.core.vocab_rows} vocabulary rows; the handshake said "
                f"{self.handshake.vocab_rows}"
            )
        log.info("engine core ready in %.2f s", time.perf_counter() - t0)

    @staticmethod
    def _handshake(config: EngineConfig, vocab_rows: int, device: str) -> Handshake:
        return Handshake(
            protocol_version=PROTOCOL_VERSION,
            model=config.model,
            tokenizer=config.resolved_tokenizer(),
            vocab_rows=vocab_rows,
            reasoning_parser=config.reasoning_parser,
            max_num_seqs=config.max_num_seqs,
            engine_pid=os.getpid(),
            extra_special_tokens=list(config.extra_special_tokens),
            device=device,
        )

    # ----- IO thread --------------------------------------------------------------

    def _make_socket(self, ctx: zmq.Context) -> zmq.Socket:
        sock = ctx.socket(zmq.ROUTER)
        # A client that does not read may queue this many messages; past that (or once
        # its connection is gone) sends to it fail, and the engine drops it.
        sock.setsockopt(zmq.SNDHWM, self.config.client_backlog)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, DEFAULT_MAX_FRAME_BYTES)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.bind(self.address)
        if self.address.startswith("ipc://"):
            os.chmod(self.address[len("ipc://") :], 0o600)
        return sock

    def _reply(self, client: bytes, msg) -> None:
        self.pump.send([client, *self._codec_io.encode(msg)])

    def _on_frames(self, frames: list[bytes]) -> None:
        client, body = frames[0], frames[1:]
        try:
            msg = self._codec_io.decode(body)
        except WireError as e:
            log.warning("bad frame from client %s: %s", client.hex(), e)
            self._reply(client, ErrorNotice(str(e), e.request_id))
            return
        now = time.monotonic()
        if isinstance(msg, Hello):
            if msg.protocol_version != PROTOCOL_VERSION:
                log.warning("client %s speaks protocol %d", client.hex(), msg.protocol_version)
                self._reply(
                    client,
                    ErrorNotice(
                        f"protocol version {msg.protocol_version} does not match the engine's "
                        f"{PROTOCOL_VERSION}"
                    ),
                )
                return
            self._clients[client] = now
            self._reply(client, self.handshake)
            return
        if client not in self._clients:
            self._reply(
                client,
                ErrorNotice(
                    NOT_GREETED, msg.request_id if isinstance(msg, EngineCoreRequest) else None
                ),
            )
            return
        self._clients[client] = now
        if isinstance(msg, Heartbeat):
            return
        if isinstance(msg, Goodbye):
            self._clients.pop(client, None)
            self.inbox.put((client, CLIENT_GONE))
            return
        if isinstance(msg, HealthRequest) and self.core is None:
            # still loading: alive, and holding the requests queued so far
            self._reply(client, HealthReply(msg.nonce, 0, self._queued, 0, self._queued))
            return
        if isinstance(msg, EngineCoreRequest | AbortRequests | HealthRequest | Shutdown):
            if self.core is None and isinstance(msg, EngineCoreRequest):
                self._queued += 1
            self.inbox.put((client, msg))
            return
        self._reply(client, ErrorNotice(f"unexpected {type(msg).__name__} message"))

    def _on_undeliverable(self, frames: list[bytes], reason: str) -> None:
        client = frames[0]
        if client not in self._clients:
            return  # already dropped (or never greeted): nothing more to do
        del self._clients[client]
        if reason == "blocked":
            log.warning(
                "client %s does not read: %d messages wait for it; dropping its requests",
                client.hex(),
                self.config.client_backlog,
            )
        else:
            log.warning(
                "client %s is gone (its connection closed); dropping its requests", client.hex()
            )
        self.inbox.put((client, CLIENT_GONE))

    def _on_disconnect(self, endpoint: str) -> None:
        log.info(
            "a client connection closed on %s (the client left, or sent a frame over "
            "the %d MiB limit)",
            endpoint,
            DEFAULT_MAX_FRAME_BYTES >> 20,
        )

    def _on_tick(self) -> None:
        now = time.monotonic()
        for client, seen in list(self._clients.items()):
            if now - seen > self.config.client_timeout_s:
                log.warning("client %s went silent; dropping its requests", client.hex())
                del self._clients[client]
                self.inbox.put((client, CLIENT_GONE))
        if now - self._last_beat >= HEARTBEAT_S:
            self._last_beat = now
            for client in self._clients:
                self._reply(client, Heartbeat(time.time()))
        ppid = self.config.parent_pid
        if ppid is not None and not self.stopping.is_set() and not _alive(ppid):
            log.warning("parent process %d is gone; shutting down", ppid)
            self.stop()

    # ----- main thread ------------------------------------------------------------

    def stop(self) -> None:
        self.stopping.set()
        self.inbox.put((b"", WAKE))

    def serve(self) -> None:
        log.info(
            "engine ready on %s (model %s, %d vocabulary rows, device %s)",
            self.address,
            self.config.model,
            self.core.vocab_rows,
            self.core.device,
        )
        print(f"thinkgate engine listening on {self.address}", flush=True)
        core = self.core
        try:
            while not self.stopping.is_set():
                if not core.has_runnable:
                    try:
                        self._handle(*self.inbox.get(timeout=0.02 if core.has_work else 0.5))
                    except queue.Empty:
                        continue
                while True:
                    try:
                        self._handle(*self.inbox.get_nowait())
                    except queue.Empty:
                        break
                if core.has_work:
                    self._pending += core.step()
                self._send_pending()
        finally:
            self._shutdown()

    def _handle(self, client: bytes, msg: object) -> None:
        core = self.core
        if isinstance(msg, EngineCoreRequest):
            self._pending += core.add_request(client, msg)
        elif isinstance(msg, AbortRequests):
            self._pending += core.abort(client, msg.request_ids)
        elif isinstance(msg, HealthRequest):
            self._send_pending()  # a reply comes after the outputs of what came before it
            so = core.so
            self._reply_main(
                client,
                HealthReply(
                    msg.nonce,
                    core.num_running,
                    core.num_waiting,
                    core.num_steps,
                    num_requests=len(core.requests),
                    num_guides=so.num_guides,
                    num_compiling=so.num_compiling,
                    num_cached_grammars=so.num_cached_grammars,
                    num_clients=len(self._clients),  # the IO thread's dict; len() is atomic
                ),
            )
        elif msg is CLIENT_GONE:
            n = core.drop_client(client)
            if n:
                log.warning("dropped %d requests of client %s", n, client.hex())
        elif isinstance(msg, Shutdown):
            log.info("shutdown requested by client %s: %s", client.hex(), msg.reason)
            self.stopping.set()

    def _send_pending(self) -> None:
        """Send the outputs gathered since the last call, one message per client: a
        burst of refused requests is a few messages, not one per request."""
        if self._pending:
            self._send(self._pending)
            self._pending = []

    def _reply_main(self, client: bytes, msg) -> None:
        self.pump.send([client, *self._codec_main.encode(msg)])

    def _send(self, outputs) -> None:
        if not outputs:
            return
        by_client: dict[bytes, list] = defaultdict(list)
        for client, out in outputs:
            by_client[client].append(out)
        now = time.time()
        for client, outs in by_client.items():
            self._reply_main(client, EngineCoreOutputs(outs, now))

    def _shutdown(self) -> None:
        core = self.core
        while True:  # requests that came while the core was loading, or since the last step
            try:
                self._handle(*self.inbox.get_nowait())
            except queue.Empty:
                break
        self._send_pending()
        pending = list(core.requests.values())
        out = []
        for r in pending:
            out += core.abort(r.client, [r.request_id])
        for _client, o in out:
            o.error = "the engine shut down"
        self._send(out)
        self.pump.close()
        core.close()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
        log.info("engine stopped")


#: what builds the core (`bench.engine_probe` puts its own here); by default the class
#: `engine.EngineCore`, imported on first use (torch, xgrammar), after the handshake
EngineCore: Callable[[EngineConfig, Tokenizer], Core] | None = None


def _engine_core_class() -> Callable[[EngineConfig, Tokenizer], Core]:
    from .engine import EngineCore as cls

    return cls


def _alive(pid: int) -> bool:
    if os.getppid() == pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_engine(config: EngineConfig) -> None:
    logging.basicConfig(
        level=getattr(logging, config.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    server = EngineServer(config)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    server.serve()
