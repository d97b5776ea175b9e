"""The engine-core process: sockets, the IO thread, and the busy loop around `EngineCore`.

Liveness is judged on evidence. A client is dropped when its connection closes (it
died, or ZeroMQ's heartbeats, answered by the client's ZeroMQ threads whatever its
Python is doing, went unanswered for ``client_timeout_s``: a stopped process or a lost
network), when it does not read its outputs, or when it sends a message over the
limit; never because its Python threads were busy. Only the client holding the
shutdown token (the one that spawned the engine) may stop it over the wire.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import logging
import os
import queue
import shutil
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from ipc import (
    DEFAULT_MAX_MESSAGE_BYTES,
    ENVELOPE_BYTES,
    NOT_GREETED,
    PROTOCOL_VERSION,
    SHUTDOWN_REFUSED,
    AbortRequests,
    AddressError,
    Codec,
    CurveKeyError,
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
    TokenFileError,
    WireError,
    check_bind_address,
    ensure_keys,
    private_ipc_address,
    read_shutdown_token,
    serve_curve,
    set_heartbeats,
)
from reasoning import load_plugin
from tokenization import Tokenizer, load_tokenizer

from .config import EngineConfig, StartupError
from .cpu_threads import one_engine_process

if TYPE_CHECKING:
    from .engine import EngineCore as Core

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
    """Start-up: the checks that need nothing loaded, the tokenizer, then the socket and
    the core (the socket first, with its handshake, when the model keeps the
    tokenizer's rows). Whatever it built before a failure, or an interrupt, is closed
    again (the socket folder included), and requests queued meanwhile get their final
    outputs."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        on_ready: Callable[[EngineServer], None] | None = None,
        lean_xgrammar: bool = False,
    ) -> None:
        """``on_ready(server)`` is called once start-up is complete (the last step):
        from then on the server must be stopped with `stop`. ``lean_xgrammar``: in a
        process of its own, xgrammar is imported without transformers
        (`structured_output.xgrammar_import`), after the handshake is out and the
        checks that need nothing loaded have passed (a start-up error costs no import)."""
        self.config = config
        self._lean_xgrammar = lean_xgrammar
        self._own_dir: Path | None = None
        self.core: Core | None = None  # the IO thread answers health checks until it is set
        self.keys = None
        self._auth = None
        self.shutdown_token: str | None = None
        self.inbox: queue.SimpleQueue[tuple[bytes, object]] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self._codec_main = Codec()
        self._codec_io = Codec()
        self._clients: dict[bytes, float] = {}  # IO thread only: last frame time
        self._pending: list[tuple[bytes, EngineCoreOutput]] = []  # main thread: outputs to send
        self._last_beat = 0.0
        self.pump: SocketPump | None = None
        self._listening = False  # the socket is bound: clients may be waiting
        self._queued = 0  # requests the IO thread queued before the core was built
        try:
            self._start()
            if on_ready is not None:
                on_ready(self)
        except BaseException:
            if self._listening:
                self._end_queued("the engine stopped before it was ready")
            self._close()
            raise

    def _start(self) -> None:
        """Checks that need nothing loaded, the tokenizer, the socket, the core. A model
        that keeps the tokenizer's rows (not a model directory) lets the handshake go
        out before the core is built: the socket answers it (and queues requests) while
        torch, xgrammar and the model load."""
        config = self.config
        t0 = time.perf_counter()
        self.shutdown_token = read_shutdown_token(config.shutdown_token_file)
        self.keys = ensure_keys(config.curve_keys) if config.curve_keys else None
        if config.address:
            check_bind_address(
                config.address,
                allow_remote=config.allow_remote,
                authenticated=self.keys is not None,
            )
        plugin = config.reasoning_parser_plugin
        if plugin:
            with _startup_step(f"cannot load --reasoning-parser-plugin {plugin!r}"):
                load_plugin(plugin)
        device = config.resolved_device()
        name = config.resolved_tokenizer()
        log.info("loading tokenizer %s", name)
        with _startup_step(f"cannot load tokenizer {name!r}"):
            tokenizer = load_tokenizer(name, config.extra_special_tokens)
        if config.address:
            self.address = config.address
        else:
            self.address, self._own_dir = private_ipc_address()
        self.pump = SocketPump(
            self._make_socket,
            self._bind,
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
        early = not Path(config.model).is_dir()
        if early:
            self.handshake = self._handshake(config, tokenizer.vocab_rows, device)
            self._listen()
            log.info("handshake ready in %.2f s", time.perf_counter() - t0)
        log.info("starting model %s on %s, and the grammar compilers", config.model, device)
        with _startup_step("cannot start the engine"):
            if self._lean_xgrammar:
                from structured_output.xgrammar_import import import_xgrammar

                import_xgrammar()
            self.core = (EngineCore or _engine_core_class())(config, tokenizer)
        if not early:
            self.handshake = self._handshake(config, self.core.vocab_rows, self.core.device)
            self._listen()
        elif self.core.vocab_rows != self.handshake.vocab_rows:
            raise StartupError(
                f"the model has {self.core.vocab_rows} vocabulary rows; the handshake said "
                f"{self.handshake.vocab_rows}"
            )
        log.info("engine core ready in %.2f s", time.perf_counter() - t0)

    def _listen(self) -> None:
        assert self.pump is not None
        with _startup_step(f"cannot bind {self.address}"):
            self.pump.start()
        self._listening = True

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
        # a client that reconnects (same id) takes its id over from the old connection
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, DEFAULT_MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.LINGER, 1000)
        set_heartbeats(sock, PING_S, self.config.client_timeout_s)
        if self.keys is not None:
            self._auth = serve_curve(sock, self.keys)
        return sock

    def _bind(self, sock: zmq.Socket) -> None:
        sock.bind(self.address)
        if self.address.startswith("ipc://"):
            os.chmod(self.address[len("ipc://") :], 0o600)

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
        if isinstance(msg, HealthRequest) and self.core is None:
            # still loading: alive, and holding the requests queued so far
            reply = HealthReply(msg.nonce, 0, self._queued, 0, self._queued)
            reply.num_clients = len(self._clients)
            self._reply(client, reply)
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
            # the engine's counters, and the IO thread's count of clients (len() is atomic)
            reply = HealthReply(msg.nonce, **dataclasses.asdict(core.stats()))
            reply.num_clients = len(self._clients)
            self._reply_main(client, reply)
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
        """Every request still held, or queued since the last step (or while the core
        loaded), gets its final output (aborted: the engine shut down); then the socket,
        the model and the compilers close."""
        try:
            while True:
                try:
                    self._handle(*self.inbox.get_nowait())
                except queue.Empty:
                    break
            self._send_pending()
            self._send(self.core.abort_all("the engine shut down"))
        finally:
            self._close()
        log.info("engine stopped")

    def _end_queued(self, error: str) -> None:
        """Start-up failed after the handshake went out: each request queued meanwhile
        gets its final output (aborted, with ``error``)."""
        out = []
        while True:
            try:
                client, msg = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(msg, EngineCoreRequest):
                why = {"finish_reason": FinishReason.ABORT, "error": error}
                out.append((client, EngineCoreOutput(msg.request_id, [], **why)))
        self._send(out)

    def _close(self) -> None:
        """Close what start-up built; each part whatever becomes of the others."""
        try:
            if self.pump is not None:
                self.pump.close()
                if self._auth is not None:
                    self._auth.stop()
        finally:
            try:
                if self.core is not None:
                    self.core.close()
            finally:
                if self._own_dir is not None:
                    shutil.rmtree(self._own_dir, ignore_errors=True)
                    self._own_dir = None


@contextlib.contextmanager
def _startup_step(what: str) -> Iterator[None]:
    """Turn a start-up failure that the settings explain (a name that is not found, a
    file that is not there, a value a component refuses) into one `StartupError`
    line; its traceback goes to the debug log."""
    try:
        yield
    except StartupError:
        raise
    except (OSError, ValueError, LookupError, ImportError, zmq.ZMQError) as e:
        log.debug("%s", what, exc_info=True)
        detail = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise StartupError(f"{what}: {detail}") from None


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


def run_engine(
    config: EngineConfig, *, prog: str = "thinkgate engine", lean_xgrammar: bool = False
) -> int:
    """Run the engine until SIGTERM, SIGINT or a client's Shutdown. Returns the exit
    code: 0, or 2 when it could not start (a bad setting, a missing file, no CUDA, an
    interrupt while loading), after one line on stderr that says why.
    ``lean_xgrammar``: see `EngineServer` (for a process that runs only the engine)."""
    logging.basicConfig(
        level=getattr(logging, config.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # While loading, SIGTERM and SIGINT interrupt start-up (which cleans up after
    # itself); once the server is ready, they stop it.
    ready: list[EngineServer] = []

    def on_signal(signum, frame) -> None:
        if not ready:
            raise KeyboardInterrupt
        ready[0].stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    one_engine_process()  # its core's builder runs torch serially (cpu_threads.py)
    try:
        server = EngineServer(config, on_ready=ready.append, lean_xgrammar=lean_xgrammar)
    except (StartupError, AddressError, CurveKeyError, TokenFileError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: error: interrupted while starting", file=sys.stderr, flush=True)
        return 2
    server.serve()
    return 1 if server.pump.failure is not None else 0  # an IO failure is logged where it happened
