"""ZeroMQ sockets, each owned by one IO thread; the rest of a process talks to the
thread through a queue and a wake-up pipe, and never touches a socket."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket as pysocket
import stat
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import zmq

log = logging.getLogger(__name__)

#: frames larger than this are refused by the socket (the peer is disconnected)
DEFAULT_MAX_FRAME_BYTES = 64 << 20


class AddressError(ValueError):
    pass


def private_ipc_address(name: str = "engine") -> tuple[str, Path]:
    """A fresh ``ipc://`` address inside a new directory only this user can enter
    (mode 0700). Returns the address and the directory (the caller removes it)."""
    directory = Path(tempfile.mkdtemp(prefix="thinkgate-"))
    os.chmod(directory, 0o700)
    return f"ipc://{directory / (name + '.sock')}", directory


def check_bind_address(address: str, *, allow_remote: bool = False) -> None:
    """Refuse addresses that would expose the engine beyond this user on this machine,
    unless ``allow_remote``: TCP must bind a loopback address; an ``ipc://`` socket must
    sit in a directory that no other user can write to."""
    if address.startswith("tcp://"):
        host = address[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
        if host in ("localhost",):
            return
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback and not allow_remote:
            raise AddressError(
                f"refusing to bind {address}: TCP binds to a loopback address unless "
                "--allow-remote is given"
            )
    elif address.startswith("ipc://"):
        parent = Path(address[len("ipc://") :]).parent
        try:
            st = parent.stat()
        except FileNotFoundError:
            raise AddressError(f"directory {str(parent)!r} of {address} does not exist") from None
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not allow_remote:
            raise AddressError(
                f"refusing to bind {address}: {str(parent)!r} is writable by other users; "
                "use a private (0700) directory, or pass --allow-remote"
            )
    elif not address.startswith("inproc://"):
        raise AddressError(f"unsupported address {address!r}: use ipc://PATH or tcp://HOST:PORT")


def free_tcp_port() -> int:
    with pysocket.socket(pysocket.AF_INET, pysocket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SocketPump:
    """One socket, one IO thread.

    ``make_socket(ctx)`` is called inside the IO thread (a bind error is re-raised
    from `start`). Each received multipart message goes to ``on_frames`` (called in
    the IO thread; it must not block). `send` may be called from any thread.
    ``on_tick`` runs in the IO thread every ``tick_s`` seconds; ``on_disconnect`` there
    too, with the endpoint, whenever a peer's connection closes (ZeroMQ also closes
    the connection of a peer that sent a frame over ``MAXMSGSIZE``).

    ``on_undeliverable(frames, reason)``, for a ROUTER socket with ``ROUTER_MANDATORY``,
    gets each outgoing message its peer cannot take: ``"blocked"`` (the peer's queue
    reached ``SNDHWM``: it does not read) or ``"gone"`` (no such peer any more). The
    message is dropped and the pump sends on to the other peers. Without it, a full
    queue holds every message back until the next wake-up.
    """

    def __init__(
        self,
        make_socket: Callable[[zmq.Context], zmq.Socket],
        on_frames: Callable[[list[bytes]], None],
        *,
        on_tick: Callable[[], None] | None = None,
        on_disconnect: Callable[[str], None] | None = None,
        on_undeliverable: Callable[[list[bytes], str], None] | None = None,
        tick_s: float = 0.1,
        name: str = "thinkgate-io",
    ) -> None:
        self._make_socket = make_socket
        self._on_frames = on_frames
        self._on_tick = on_tick
        self._on_disconnect = on_disconnect
        self._on_undeliverable = on_undeliverable
        self._tick_s = tick_s
        self._out: deque[list[bytes]] = deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("IO thread did not start")
        if self._error is not None:
            raise self._error

    def send(self, frames: list[bytes]) -> None:
        """Queue a multipart message for the IO thread to send."""
        self._out.append(frames)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full: the IO thread is already due to wake up

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then close the socket and stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        try:
            sock = self._make_socket(ctx)
        except BaseException as e:  # re-raised by start() in the caller's thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        monitor = None
        if self._on_disconnect is not None:
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            poller.register(monitor, zmq.POLLIN)
        next_tick = time.monotonic() + self._tick_s
        try:
            while not self._stopping.is_set():
                timeout_ms = max(0.0, (next_tick - time.monotonic()) * 1000)
                events = dict(poller.poll(timeout_ms))
                if events.get(sock):
                    self._receive(sock)
                if monitor is not None and events.get(monitor):
                    self._disconnects(monitor)
                if events.get(self._wake_r):
                    try:
                        os.read(self._wake_r, 65536)
                    except BlockingIOError:
                        pass
                self._flush(sock)
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + self._tick_s
                    if self._on_tick is not None:
                        self._on_tick()
            self._flush(sock)
        except Exception:
            log.exception("IO thread failed")
        finally:
            if monitor is not None:
                sock.disable_monitor()
                monitor.close(linger=0)
            sock.close(linger=1000)

    def _disconnects(self, monitor: zmq.Socket) -> None:
        from zmq.utils.monitor import recv_monitor_message

        assert self._on_disconnect is not None
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            endpoint = event.get("endpoint", b"")
            self._on_disconnect(
                endpoint.decode(errors="replace") if isinstance(endpoint, bytes) else str(endpoint)
            )

    def _receive(self, sock: zmq.Socket) -> None:
        for _ in range(1024):  # bounded, so that sending is never starved
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._on_frames(frames)
            except Exception:
                # A peer's message must never end the IO thread (the process would go
                # deaf while still alive): a handler that fails costs that message only.
                log.exception("dropped a message whose handler failed")

    def _flush(self, sock: zmq.Socket) -> None:
        out = self._out
        while out:
            frames = out.popleft()
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                if self._on_undeliverable is not None:
                    self._on_undeliverable(frames, "blocked")
                    continue
                out.appendleft(frames)  # peer's queue is full: retry on the next wake-up
                return
            except zmq.ZMQError as e:  # e.g. an unroutable peer that went away
                if self._on_undeliverable is not None and e.errno == zmq.EHOSTUNREACH:
                    self._on_undeliverable(frames, "gone")
                else:
                    log.warning("dropped an outgoing message: %s", e)
