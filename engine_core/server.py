"""The engine-core process: sockets, the IO thread, and the busy loop around `EngineCore`.

Liveness is judged on evidence. A client is dropped when its connection closes (it
died, or ZeroMQ's heartbeats, answered by the client's ZeroMQ threads whatever its
Python is doing, went unanswered for ``client_timeout_s``: a stopped process or a lost
network), when it does not read its outputs, or when it sends a message over the
limit; never because its Python threads were busy. Only the client holding the
shutdown token (the one that spawned the engine) may stop it over the wire.
"""

from __future__ import annotations

import hmac
import logging
import os
import queue
import shutil
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path

import zmq

from ipc import (
    DEFAULT_MAX_MESSAGE_BYTES,
    ENVELOPE_BYTES,
    NOT_GREETED,
    PROTOCOL_VERSION,
    SHUTDOWN_REFUSED,
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
    ensure_keys,
    private_ipc_address,
    serve_curve,
    set_heartbeats,
)
from reasoning import load_plugin
from tokenization import load_tokenizer

from .config import EngineConfig
from .engine import EngineCore

log = logging.getLogger("thinkgate.engine")

#: a heartbeat to each client this often: a send to a client whose connection has
#: closed fails, and the engine drops that client
HEARTBEAT_S = 0.5
#: ZeroMQ's own PING to each client this often (see `ipc.set_heartbeats`)
PING_S = 1.0
#: frames of a client's message as the ROUTER reads them: its id, type, payload
MESSAGE_PARTS = 3
#: monitor events of the engine's socket: a connection closed, a handshake refused
_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


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
        self.keys = ensure_keys(config.curve_keys) if config.curve_keys else None
        self._auth = None
        self.shutdown_token = _read_token(config.shutdown_token_file)
        if config.address:
            self.address = config.address
            check_bind_address(
                self.address, allow_remote=config.allow_remote, authenticated=self.keys is not None
            )
        else:
            self.address, self._own_dir = private_ipc_address()
        tokenizer = load_tokenizer(config.resolved_tokenizer(), config.extra_special_tokens)
        self.core = EngineCore(config, tokenizer)
        self.inbox: queue.SimpleQueue[tuple[bytes, object]] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self._codec_main = Codec()
        self._codec_io = Codec()
        self._clients: dict[bytes, float] = {}  # IO thread only: last frame time
        self._pending: list[tuple[bytes, EngineCoreOutput]] = []  # main thread: outputs to send
        self._last_beat = 0.0
        self.handshake = Handshake(
            protocol_version=PROTOCOL_VERSION,
            model=config.model,
            tokenizer=config.resolved_tokenizer(),
            vocab_rows=self.core.vocab_rows,
            reasoning_parser=config.reasoning_parser,
            max_num_seqs=config.max_num_seqs,
            engine_pid=os.getpid(),
            extra_special_tokens=list(config.extra_special_tokens),
            device=self.core.device,
        )
        self.pump = SocketPump(
            self._make_socket,
            self._on_frames,
            on_tick=self._on_tick,
            monitor_events=_EVENTS,
            on_event=self._on_event,
            on_undeliverable=self._on_undeliverable,
            max_parts=MESSAGE_PARTS,
            max_bytes=DEFAULT_MAX_MESSAGE_BYTES + ENVELOPE_BYTES,
            on_oversized=self._on_oversized,
            on_failure=self._on_io_failure,
            tick_s=0.1,
            name="thinkgate-engine-io",
        )

    # ----- IO thread --------------------------------------------------------------

    def _make_socket(self, ctx: zmq.Context) -> zmq.Socket:
        sock = ctx.socket(zmq.ROUTER)
        # A client that does not read may queue this many messages; past that (or once
        # its connection is gone) sends to it fail, and the engine drops it.
        sock.setsockopt(zmq.SNDHWM, self.config.client_backlog)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # a client that reconnects (same id) takes its id over from the old connection
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, DEFAULT_MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.LINGER, 1000)
        set_heartbeats(sock, PING_S, self.config.client_timeout_s)
        if self.keys is not None:
            self._auth = serve_curve(sock, self.keys)
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
        if isinstance(msg, Shutdown) and not self._may_stop(msg):
            log.warning("refused a SHUTDOWN from client %s: wrong or no token", client.hex())
            why = (
                "this engine has no shutdown token (stop it with SIGTERM)"
                if self.shutdown_token is None
                else "its token is not the engine's"
            )
            self._reply(client, ErrorNotice(f"{SHUTDOWN_REFUSED}: {why}"))
            return
        if isinstance(msg, EngineCoreRequest | AbortRequests | HealthRequest | Shutdown):
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
                "client %s is gone (its connection closed, or it answered no heartbeat for "
                "%g s); dropping its requests",
                client.hex(),
                self.config.client_timeout_s,
            )
        self.inbox.put((client, CLIENT_GONE))

    def _may_stop(self, msg: Shutdown) -> bool:
        token = self.shutdown_token
        return token is not None and hmac.compare_digest(msg.token.encode(), token.encode())

    def _on_event(self, event: int, endpoint: str) -> None:
        if event == zmq.EVENT_DISCONNECTED:
            log.info("a client connection closed on %s", endpoint)
            self._probe()  # a send to a client whose connection closed fails: drop it
        else:
            log.warning(
                "refused a connection on %s: its handshake failed (%s)",
                endpoint,
                "not an accepted CURVE key"
                if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH
                else "wrong or no encryption, or not ZeroMQ",
            )

    def _on_oversized(self, client: bytes, parts: int, size: int) -> None:
        """A message past the limits was read to its end and dropped uncopied. More
        frames than the protocol has: that message is refused. More bytes than the
        limit: the client is dropped too (no client of ours sends one; it checks)."""
        frames = parts - 1  # the ROUTER's routing-id frame is not the client's
        if size <= DEFAULT_MAX_MESSAGE_BYTES + ENVELOPE_BYTES:
            if client:
                self._reply(client, ErrorNotice(f"expected 2 frames (type, payload), got {frames}"))
            return
        log.warning(
            "client %s sent a message of %d frames, %d bytes, over the %d MiB limit; dropped "
            "it, and the client with its requests",
            client.hex() or "?",
            frames,
            size,
            DEFAULT_MAX_MESSAGE_BYTES >> 20,
        )
        if self._clients.pop(client, None) is not None:
            self.inbox.put((client, CLIENT_GONE))
        if client:
            self._reply(
                client,
                ErrorNotice(
                    f"a message of {frames} frames, {size} bytes is over the engine's limit "
                    f"of {DEFAULT_MAX_MESSAGE_BYTES} bytes: dropped, with this client's requests"
                ),
            )

    def _on_io_failure(self, error: BaseException) -> None:
        """The IO thread died and its socket closed: no client can be served; stop
        (clients see the connection close, and fail their requests)."""
        log.error("the engine's IO thread failed (%r): stopping", error)
        self.stop()

    def _probe(self) -> None:
        for client in self._clients:
            self._reply(client, Heartbeat(time.time()))

    def _on_tick(self) -> None:
        now = time.monotonic()
        if now - self._last_beat >= HEARTBEAT_S:
            self._last_beat = now
            self._probe()
        ppid = self.config.parent_pid
        if ppid is not None and not self.stopping.is_set() and not _alive(ppid):
            log.warning("parent process %d is gone; shutting down", ppid)
            self.stop()

    # ----- main thread ------------------------------------------------------------

    def stop(self) -> None:
        self.stopping.set()
        self.inbox.put((b"", WAKE))

    def serve(self) -> None:
        self.pump.start()
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
        self._send_pending()
        pending = list(core.requests.values())
        out = []
        for r in pending:
            out += core.abort(r.client, [r.request_id])
        for _client, o in out:
            o.error = "the engine shut down"
        self._send(out)
        self.pump.close()
        if self._auth is not None:
            self._auth.stop()
        core.close()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
        log.info("engine stopped")


class TokenFileError(ValueError):
    """A --shutdown-token-file that cannot be used."""


def _read_token(path: str | None) -> str | None:
    """The shutdown token in file ``path`` (None: no file, no token)."""
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise TokenFileError(f"cannot read --shutdown-token-file {path!r}: {e.strerror}") from None
    if not token:
        raise TokenFileError(f"--shutdown-token-file {path!r} is empty")
    return token


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
    if server.pump.failure is not None:  # logged where it happened
        raise SystemExit(1)
