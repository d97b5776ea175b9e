"""Whether the engine is gone, judged on evidence, in a client's IO thread.

Evidence: a spawned engine's process exited; the connection closed and a new one
was refused (nothing listens at the address any more), or did not come back within
``reconnect_grace_s`` of this process's own running time (`ipc.RunningClock`: a stall
of this process does not count); the handshake of a new connection failed. A closed
connection itself is only a suspicion: a client stalled past the heartbeat timeout
loses its connection to a live engine, and gets it back at once.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable

import zmq

from ipc import RunningClock

log = logging.getLogger("thinkgate.client")

#: the monitor events `EngineWatch` reads
EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_FAILED_HANDSHAKE = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "the handshake failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "the handshake failed: wrong or no encryption "
    "(CURVE keys), or not a ZeroMQ peer",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the engine refused this client's CURVE key",
}


class EngineWatch:
    """The state of a client's connection; every method runs in the IO thread.

    ``on_dead(reason)``: the engine is gone (called once). ``on_back()``: the
    connection closed and came back (the engine lives; what was in flight may be
    lost). ``on_refused(why)``: the engine's handshake never came because the
    connection's own handshake failed (keys).
    """

    def __init__(
        self,
        address: str,
        proc: subprocess.Popen | None,
        *,
        reconnect_grace_s: float,
        tick_s: float,
        on_dead: Callable[[str], None],
        on_back: Callable[[], None],
        on_refused: Callable[[str], None],
    ) -> None:
        self.address = address
        self.proc = proc
        self.reconnect_grace_s = reconnect_grace_s
        self.clock = RunningClock(tick_s)
        self._on_dead = on_dead
        self._on_back = on_back
        self._on_refused = on_refused
        #: the engine's handshake has arrived
        self.greeted = False
        self.dead = False
        self._down_since: float | None = None  # running time the connection closed at

    def die(self, reason: str) -> None:
        if not self.dead:
            self.dead = True
            self._on_dead(reason)

    def event(self, event: int, endpoint: str) -> None:
        if self.dead:
            return
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if self._down_since is not None:
                self._down_since = None
                log.warning("the connection to the engine came back; requests in flight are lost")
                self._on_back()
        elif event in _FAILED_HANDSHAKE:
            why = f"{_FAILED_HANDSHAKE[event]} ({self.address})"
            if self.greeted:
                self.die(why)
            else:
                self._on_refused(why)
        elif not self.greeted:
            return  # before the engine's handshake, a slow start is not a death
        elif event == zmq.EVENT_DISCONNECTED:
            if self._down_since is None:
                self._down_since = self.clock.now
                log.warning("the connection to the engine at %s closed", self.address)
        elif event == zmq.EVENT_CLOSED and self._down_since is not None:
            # a new connection failed: nothing listens at the address any more
            self.die(f"the connection to the engine at {self.address} closed, and it is gone")

    def tick(self) -> None:
        now = self.clock.tick()
        if self.dead:
            return
        if self.proc is not None and self.proc.poll() is not None:
            self.die(f"the engine process exited with code {self.proc.returncode}")
        elif self._down_since is not None and now - self._down_since > self.reconnect_grace_s:
            self.die(
                f"the connection to the engine at {self.address} closed and did not come "
                f"back within {self.reconnect_grace_s:g} s"
            )
