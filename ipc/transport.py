"""ZeroMQ sockets, each owned by one IO thread; the rest of a process talks to the
thread through a queue and a wake-up pipe, and never touches a socket.

Limits: ZeroMQ's ``MAXMSGSIZE`` bounds each frame; `SocketPump` bounds each whole
message (its parts and their bytes), receiving it frame by frame without copying and
dropping it past the limit. ZeroMQ holds a multipart message in memory until its last
frame has arrived, so only a peer allowed to connect can make the process hold one
oversized message at a time: sockets are private to the user (ipc:// in a 0700
directory, TCP on loopback), or authenticated with CURVE (`ipc.keys`)."""

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

#: the largest message a peer may send (type and payload frames together); a frame
#: larger than this is refused by ZeroMQ itself (the peer is disconnected)
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
#: allowance for the routing-id frame a ROUTER socket puts before each message
ENVELOPE_BYTES = 256


class AddressError(ValueError):
    pass


def private_ipc_address(name: str = "engine") -> tuple[str, Path]:
    """A fresh ``ipc://`` address inside a new directory only this user can enter
    (mode 0700). Returns the address and the directory (the caller removes it)."""
    directory = Path(tempfile.mkdtemp(prefix="thinkgate-"))
    os.chmod(directory, 0o700)
    return f"ipc://{directory / (name + '.sock')}", directory


def check_bind_address(
    address: str, *, allow_remote: bool = False, authenticated: bool = False
) -> None:
    """Refuse addresses that would expose the engine beyond this user on this machine,
    unless ``allow_remote``: TCP must bind a loopback address; an ``ipc://`` socket must
    sit in a directory that no other user can write to (and have a path: an abstract
    socket is refused). A TCP address beyond loopback also needs ``authenticated``
    (CURVE keys): otherwise anyone on the network could submit work and read outputs."""
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
        if not loopback and not authenticated:
            raise AddressError(
                f"refusing to bind {address} without authentication: --allow-remote needs "
                "--curve-keys DIR (keys are made there if missing; see the README)"
            )
    elif address.startswith("ipc://"):
        if address.startswith("ipc://@"):
            raise AddressError(
                f"refusing to bind {address}: an abstract socket has no file permissions, so "
                "any local user could connect; use ipc://PATH in a private directory"
            )
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

    ``make_socket(ctx)`` (create and configure the socket) and then ``attach(sock)``
    (bind or connect it) are called inside the IO thread, the monitor in between, so
    that no event of the first connection is missed: ZeroMQ does not retry a
    connection whose handshake failed, so its one event is the only news of it. An
    error of either is re-raised from `start`. Each received multipart message goes
    to ``on_frames`` (called in the IO thread; it must not block). `send` may be
    called from any thread. ``on_tick`` runs in the IO thread every ``tick_s``
    seconds.

    ``monitor_events`` (a mask of ``zmq.EVENT_*``) are passed to ``on_event(event,
    endpoint)`` in the IO thread: a connection closed, a handshake done or refused.

    A message of more than ``max_parts`` frames or ``max_bytes`` bytes is received
    frame by frame and dropped without being copied; ``on_oversized(first frame,
    parts, bytes)`` is told (the first frame is empty when it is itself too large).

    ``on_undeliverable(frames, reason)``, for a ROUTER socket with ``ROUTER_MANDATORY``,
    gets each outgoing message its peer cannot take: ``"blocked"`` (the peer's queue
    reached ``SNDHWM``: it does not read) or ``"gone"`` (no such peer any more). The
    message is dropped and the pump sends on to the other peers. Without it, a full
    queue holds every message back until the next wake-up.

    ``on_failure(error)`` runs in the IO thread if the thread fails (a bug, or ZeroMQ
    failing under it): the socket is closed and nothing more is sent or received, so
    the owner must stop as well.
    """

    def __init__(
        self,
        make_socket: Callable[[zmq.Context], zmq.Socket],
        attach: Callable[[zmq.Socket], None],
        on_frames: Callable[[list[bytes]], None],
        *,
        on_tick: Callable[[], None] | None = None,
        monitor_events: int = 0,
        on_event: Callable[[int, str], None] | None = None,
        on_undeliverable: Callable[[list[bytes], str], None] | None = None,
        max_parts: int = 64,
        max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        on_oversized: Callable[[bytes, int, int], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        tick_s: float = 0.1,
        name: str = "thinkgate-io",
    ) -> None:
        self._make_socket = make_socket
        self._attach = attach
        self._on_frames = on_frames
        self._on_tick = on_tick
        self._monitor_events = monitor_events
        self._on_event = on_event
        self._on_undeliverable = on_undeliverable
        self._max_parts = max_parts
        self._max_bytes = max_bytes
        self._on_oversized = on_oversized
        self._on_failure = on_failure
        self._tick_s = tick_s
        self._out: deque[list[bytes]] = deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        #: why the IO thread ended early, if it did
        self.failure: BaseException | None = None
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
            pass  # the pipe is full (the IO thread is already due to wake up), or closed

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
        sock = monitor = None
        try:
            sock = self._make_socket(ctx)
            if self._monitor_events and self._on_event is not None:
                monitor = sock.get_monitor_socket(self._monitor_events)
            self._attach(sock)
        except BaseException as e:  # re-raised by start() in the caller's thread
            self._error = e
            if sock is not None:
                _close(sock, monitor, linger=0)
            self._ready.set()
            return
        self._ready.set()
        try:
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(self._wake_r, zmq.POLLIN)
            if monitor is not None:
                poller.register(monitor, zmq.POLLIN)
            next_tick = time.monotonic() + self._tick_s
            while not self._stopping.is_set():
                timeout_ms = max(0.0, (next_tick - time.monotonic()) * 1000)
                events = dict(poller.poll(timeout_ms))
                if events.get(sock):
                    self._receive(sock)
                if monitor is not None and events.get(monitor):
                    self._events(monitor)
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
        except BaseException as e:
            self.failure = e
            log.exception("IO thread failed; its socket closes")
        finally:
            _close(sock, monitor, linger=0 if self.failure is not None else 1000)
        if self.failure is not None and self._on_failure is not None:
            try:
                self._on_failure(self.failure)
            except Exception:
                log.exception("the IO thread's failure handler failed")

    def _events(self, monitor: zmq.Socket) -> None:
        from zmq.utils.monitor import recv_monitor_message

        assert self._on_event is not None
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            endpoint = event.get("endpoint", b"")
            self._on_event(
                int(event["event"]),
                endpoint.decode(errors="replace") if isinstance(endpoint, bytes) else str(endpoint),
            )

    def _receive(self, sock: zmq.Socket) -> None:
        for _ in range(1024):  # bounded, so that sending is never starved
            frames = self._recv_message(sock)
            if frames is None:
                return
            if not frames:
                continue  # dropped: over the limit
            try:
                self._on_frames(frames)
            except Exception:
                # A peer's message must never end the IO thread (the process would go
                # deaf while still alive): a handler that fails costs that message only.
                log.exception("dropped a message whose handler failed")

    def _recv_message(self, sock: zmq.Socket) -> list[bytes] | None:
        """The next whole message (None: nothing waiting; []: one that was over the
        limit, received to its end and dropped). ZeroMQ delivers a multipart message
        only once all of it has arrived, so the rest of its frames never block."""
        try:
            frame = sock.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        size = len(frame)
        first = frame.bytes if size <= ENVELOPE_BYTES else b""
        parts: list[zmq.Frame] | None = [frame]
        count = 1
        while frame.more:
            frame = sock.recv(copy=False)
            count += 1
            size += len(frame)
            if parts is not None:
                if count > self._max_parts or size > self._max_bytes:
                    parts = None  # frees what was kept; the rest is read and let go
                else:
                    parts.append(frame)
        if parts is None or size > self._max_bytes:
            if self._on_oversized is not None:
                self._on_oversized(first, count, size)
            else:
                log.warning("dropped a message of %d parts, %d bytes: over the limit", count, size)
            return []
        return [f.bytes for f in parts]

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


def set_heartbeats(sock: zmq.Socket, interval_s: float, timeout_s: float) -> None:
    """ZeroMQ's own heartbeats on ``sock``: a PING every ``interval_s``, and the
    connection closed when nothing (not even a PONG) arrives for ``timeout_s``. ZeroMQ's
    IO threads answer them, in C++, so a process whose Python threads are starved (a
    long computation holding the GIL) still answers; only a stopped or vanished
    process, or a lost network, goes silent."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(interval_s * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, int(timeout_s * 1000)))


class RunningClock:
    """Time during which this process was running: the wall clock, less the gaps in
    which a thread that ticks every ``tick_s`` did not get to run (the process was
    stopped, swapped out, or its Python threads starved). A silence measured on this
    clock happened while we were able to hear."""

    def __init__(self, tick_s: float, *, slack_s: float = 0.25) -> None:
        self._max_step = 2 * tick_s + slack_s
        self._last = time.monotonic()
        self._now = 0.0
        #: the longest stall seen (seconds), for logs
        self.longest_stall_s = 0.0

    def tick(self) -> float:
        """Call from the ticking thread; returns the running time."""
        t = time.monotonic()
        gap = t - self._last
        self._last = t
        if gap > self._max_step:
            self.longest_stall_s = max(self.longest_stall_s, gap)
        self._now += min(gap, self._max_step)
        return self._now

    @property
    def now(self) -> float:
        return self._now


def _close(sock: zmq.Socket, monitor: zmq.Socket | None, *, linger: int) -> None:
    """Close ``sock`` and its ``monitor`` (if it has one)."""
    if monitor is not None:
        try:
            sock.disable_monitor()
        except zmq.ZMQError:
            pass
        monitor.close(linger=0)
    sock.close(linger=linger)
