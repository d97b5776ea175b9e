"""``thinkgate serve``: the HTTP server process.

It starts an engine-core process (or joins a running one), builds the front end,
and serves the API with uvicorn until SIGINT or SIGTERM; then it stops taking
requests, lets those in flight finish for a few seconds, and stops the engine it
started. What it is doing is printed as it goes; the line ``thinkgate serving on
http://HOST:PORT`` comes once the socket accepts requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn

from engine_core.client import EngineClient, EngineStartError
from engine_core.config import EngineConfig

from .api_server import build_app
from .config import ConfigError, FrontendConfig
from .metrics import Metrics
from .serving import ChatFrontend

#: seconds requests in flight get to finish once a shutdown begins
GRACEFUL_S = 5


class StartupError(RuntimeError):
    """The server cannot start; the message says why and what to change."""


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    #: join this running engine instead of starting one
    engine_address: str | None = None
    #: an engine silent this long is taken for dead (for good: every request then gets
    #: 503). A started engine that exits is seen at once, whatever this says; the
    #: limit is for one that hangs, and must outlast a busy machine's pauses
    engine_timeout_s: float = 30.0
    log_level: str = "info"


def say(text: str) -> None:
    print(f"thinkgate serve: {text}", file=sys.stderr, flush=True)


class _Server(uvicorn.Server):
    """uvicorn's server with the signals left to `serve` (uvicorn would re-raise them
    after its shutdown, before the engine is stopped)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _ticker(what: str, every_s: float = 5.0) -> None:
    """Say every few seconds that ``what`` is still going on."""
    t0 = time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        say(f"{what} ({time.monotonic() - t0:.0f} s so far)")


class Interrupted(Exception):
    """A signal came before the server was up."""


async def _start_engine(
    engine: EngineConfig, server: ServerConfig, stop: asyncio.Event
) -> EngineClient:
    """The engine client, started or joined; `Interrupted` if ``stop`` is set first."""
    t0 = time.monotonic()
    if server.engine_address:
        say(f"joining the engine at {server.engine_address}")
        start = EngineClient.connect(
            server.engine_address, engine_timeout_s=server.engine_timeout_s
        )
        waiting = "waiting for the engine's handshake"
    else:
        say(
            f"starting the engine (model {engine.model}, vocabulary "
            f"{engine.resolved_tokenizer()}, device {engine.device}): it imports torch, "
            "loads the vocabulary and the model, then starts its grammar compile workers"
        )
        start = EngineClient.spawn(engine, engine_timeout_s=server.engine_timeout_s)
        waiting = "the engine is still starting"
    ticker = asyncio.ensure_future(_ticker(waiting))
    starting = asyncio.ensure_future(start)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()  # the client stops the engine it was starting
            with contextlib.suppress(asyncio.CancelledError, EngineStartError):
                await starting
            raise Interrupted()
        try:
            client = starting.result()
        except EngineStartError as e:
            if stop.is_set():  # Ctrl-C reached the engine too
                raise Interrupted() from None
            raise StartupError(f"the engine did not start: {e}") from None
    finally:
        ticker.cancel()
        stopped.cancel()
    hs = client.handshake
    assert hs is not None
    say(
        f"engine ready in {time.monotonic() - t0:.1f} s (pid {hs.engine_pid}, model {hs.model}, "
        f"device {hs.device}); the first request with a grammar may wait for the compile "
        "workers to load the vocabulary"
    )
    return client


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything slow starts (a port in use is
    said at once)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise StartupError(f"--host {host!r}: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise StartupError(
            f"cannot listen on {host}:{port}: {e.strerror} (choose another --port)"
        ) from None
    return sock


async def serve(engine: EngineConfig, frontend: FrontendConfig, server: ServerConfig) -> int:
    """Run the server until SIGINT or SIGTERM; the exit status."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sock = bind(server.host, server.port)
    try:
        client = await _start_engine(engine, server, stop)
    except Interrupted:
        sock.close()
        say("interrupted before the server was up")
        return 130
    except BaseException:
        sock.close()
        raise
    try:
        if stop.is_set():
            return 0
        say("loading the front end's vocabulary and chat template")
        try:
            chat = ChatFrontend.create(client, frontend)
        except ConfigError as e:
            raise StartupError(str(e)) from None
        app = build_app(chat, api_key=server.api_key, metrics=Metrics())
        config = uvicorn.Config(
            app,
            host=server.host,
            port=server.port,
            log_level=server.log_level.lower(),
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_S,
        )
        http = _Server(config)

        async def announce() -> None:
            while not http.started:
                if http.should_exit:
                    return
                await asyncio.sleep(0.02)
            port = sock.getsockname()[1]
            print(f"thinkgate serving on http://{server.host}:{port}", flush=True)

        async def shutdown_on_signal() -> None:
            await stop.wait()
            say("shutting down: no new requests; requests in flight get a few seconds")
            http.should_exit = True
            stop.clear()
            await stop.wait()  # a second signal: do not wait for anything
            http.force_exit = True

        helpers = [asyncio.ensure_future(announce()), asyncio.ensure_future(shutdown_on_signal())]
        try:
            await http.serve(sockets=[sock])
        finally:
            for h in helpers:
                h.cancel()
        return 0
    finally:
        sock.close()
        if client.proc is not None:
            say("stopping the engine")
        await client.shutdown()
        say("stopped")
