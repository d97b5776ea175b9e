"""Who may reach and stop an engine: an abstract ipc:// socket is refused in one line;
SHUTDOWN is obeyed only with the engine's token (the spawner's); an engine bound
beyond loopback requires CURVE, admits only clients holding a listed key, and serves
them encrypted."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq
import zmq.auth

from engine_core.client import EngineClient, EngineStartError
from engine_core.config import EngineConfig
from ipc import (
    SHUTDOWN_REFUSED,
    AddressError,
    ClientKeys,
    EngineCoreRequest,
    ErrorNotice,
    FinishReason,
    SamplingParams,
    Shutdown,
    check_bind_address,
    ensure_keys,
    free_tcp_port,
    load_client_keys,
)
from ipc.transport import SocketPump
from tests.support.engine import NO_WORKERS, ServedEngine
from tests.support.processes import ROOT

from .support import PROMPT, RawPeer, wait_until

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="ZeroMQ built without CURVE")


def _engine_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine_core", "--model", "random", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=ROOT,
        timeout=120,
    )


# ----- addresses ---------------------------------------------------------------------


def test_an_abstract_ipc_socket_is_refused_in_one_line():
    with pytest.raises(AddressError, match="abstract socket has no file permissions"):
        check_bind_address("ipc://@thinkgate")
    with pytest.raises(AddressError, match="abstract"):
        check_bind_address("ipc://@thinkgate", allow_remote=True)
    res = _engine_cli("--address", "ipc://@thinkgate-test")
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "abstract socket" in lines[0], res.stderr[-2000:]


def test_allow_remote_without_keys_is_refused_in_one_line():
    res = _engine_cli("--allow-remote", "--address", f"tcp://0.0.0.0:{free_tcp_port()}")
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--curve-keys" in lines[0], res.stderr[-2000:]


# ----- SHUTDOWN -------------------------------------------------------------------------


def test_only_the_spawner_may_shut_the_engine_down():
    async def body():
        owner = await EngineClient.spawn(
            EngineConfig(model="random", max_num_seqs=4, structured_output=NO_WORKERS),
            load_tokenizer=False,
        )
        other = await EngineClient.connect(owner.address, load_tokenizer=False)
        peer = RawPeer(owner.address)
        try:
            peer.hello()
            for token in ("", "guess", "x" * 10_000):
                peer.send_msg(Shutdown("raw peer", token))
                msg = await asyncio.to_thread(peer.recv, 30)
                assert isinstance(msg, ErrorNotice), msg
                assert msg.message.startswith(SHUTDOWN_REFUSED), msg
            # a connected client without the token only leaves
            await other.shutdown(timeout_s=5)
            assert owner.proc.poll() is None
            deadline = time.monotonic() + 30
            while (await owner.health()).num_clients != 2:  # the owner and the raw peer
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            last = None
            async for out in owner.generate(
                EngineCoreRequest("still", PROMPT, SamplingParams(max_tokens=3))
            ):
                last = out
            assert last is not None and last.finish_reason == FinishReason.LENGTH
            t0 = time.monotonic()
            await owner.shutdown(timeout_s=30)
            return owner.proc.returncode, time.monotonic() - t0
        finally:
            peer.close()
            if owner.proc.poll() is None:
                owner.proc.kill()

    code, took = asyncio.run(body())
    assert code == 0 and took < 30  # it exited on the SHUTDOWN, not on a signal


def test_an_operators_engine_obeys_only_its_token_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    os.chmod(token, 0o600)
    engine = ServedEngine(
        ["--model", "random", "--shutdown-token-file", str(token), "--compile-workers", "0"],
        tmp_path / "e.log",
    )
    try:

        async def body():
            wrong = await EngineClient.connect(
                engine.address, shutdown_token="nope", load_tokenizer=False
            )
            with pytest.raises(RuntimeError, match=SHUTDOWN_REFUSED):
                await wrong.shutdown(timeout_s=10)
            assert engine.proc.poll() is None
            right = await EngineClient.connect(
                engine.address, shutdown_token="s3cret-token", load_tokenizer=False
            )
            await right.shutdown(timeout_s=30)
            return right.dead_reason

        reason = asyncio.run(body())
        assert engine.proc.wait(30) == 0, engine.log()[-2000:]
        assert reason is not None  # it saw the engine go
    finally:
        engine.stop()
    assert "refused a SHUTDOWN" in engine.log()


def test_without_a_token_file_every_shutdown_is_refused(tmp_path):
    engine = ServedEngine(["--model", "random", "--compile-workers", "0"], tmp_path / "e.log")
    try:
        peer = RawPeer(engine.address)
        try:
            peer.hello()
            peer.send_msg(Shutdown("please", "anything"))
            msg = peer.recv(30)
            assert isinstance(msg, ErrorNotice) and "SIGTERM" in msg.message, msg
            assert peer.health(1)[0].nonce == 1
        finally:
            peer.close()
        assert engine.proc.poll() is None
    finally:
        assert engine.stop() == 0


# ----- CURVE --------------------------------------------------------------------------


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture(scope="module")
def curve_engine(tmp_path_factory):
    """An engine on all interfaces with --allow-remote and keys made at start-up."""
    base = tmp_path_factory.mktemp("curve")
    keys = base / "keys"
    port = free_tcp_port()
    engine = ServedEngine(
        [
            "--model",
            "random",
            "--max-num-seqs",
            "8",
            "--allow-remote",
            "--curve-keys",
            str(keys),
            "--compile-workers",
            "0",
        ],
        base / "engine.log",
        address=f"tcp://0.0.0.0:{port}",
    )
    yield engine, keys, f"tcp://127.0.0.1:{port}", base
    engine.stop()


def test_the_engine_makes_private_keys(curve_engine):
    _, keys, _, _ = curve_engine
    assert _mode(keys) == 0o700
    for name in ("engine.key_secret", "client.key_secret"):
        assert _mode(keys / name) == 0o600
    assert (keys / "clients" / "client.key").exists()
    # made once: a second look finds the same keys
    assert ensure_keys(keys).public == zmq.auth.load_certificate(keys / "engine.key")[0]


def test_a_curve_engine_serves_a_client_holding_the_keys(curve_engine):
    """The documented way: the front end gets a directory of its own holding
    engine.key and client.key_secret."""
    _, keys, address, base = curve_engine
    mine = base / "frontend-keys"
    mine.mkdir(mode=0o700)
    shutil.copy(keys / "engine.key", mine)
    shutil.copy(keys / "client.key_secret", mine)

    async def body():
        client = await EngineClient.connect(address, curve_keys=mine, timeout_s=60)
        try:
            last = None
            async for out in client.generate(
                EngineCoreRequest("enc", PROMPT, SamplingParams(max_tokens=4, ignore_eos=True))
            ):
                last = out
            return last, await client.health()
        finally:
            await client.close()

    last, health = asyncio.run(body())
    assert last is not None and last.finish_reason == FinishReason.LENGTH
    assert health.num_steps >= 4


def test_a_curve_engine_refuses_clients_without_a_listed_key(curve_engine, tmp_path):
    engine, keys, address, _ = curve_engine
    server_public = zmq.auth.load_certificate(keys / "engine.key")[0]
    stranger_public, stranger_secret = zmq.curve_keypair()
    wrong_server_public, _ = zmq.curve_keypair()
    client_keys = load_client_keys(keys)
    cases = {
        # no CURVE at all: the handshake fails on the mechanism
        "no keys": None,
        # a valid key pair the engine does not list
        "unlisted key": ClientKeys(server_public, stranger_public, stranger_secret),
        # the right client key, but talking to the wrong engine key
        "wrong engine key": ClientKeys(wrong_server_public, client_keys.public, client_keys.secret),
    }
    log_before = engine.log()

    async def attempt(keys_) -> str:
        t0 = time.monotonic()
        with pytest.raises(EngineStartError) as err:
            await EngineClient.connect(
                address, curve_keys=keys_, timeout_s=60
            )  # a refusal ends it at once
        return f"{time.monotonic() - t0:.1f} s: {err.value}"

    outcomes = {name: asyncio.run(attempt(k)) for name, k in cases.items()}
    print("\n".join(f"{k}: {v}" for k, v in outcomes.items()))
    assert "refused this client's CURVE key" in outcomes["unlisted key"]
    assert "handshake failed" in outcomes["no keys"]
    # the engine saw each attempt fail and said why (its IO thread logs the socket's
    # event, which may come after the client has its answer), and serves on
    wait_until(
        lambda: "not an accepted CURVE key" in engine.log()[len(log_before) :],
        10,
        "the engine logs the refused key",
    )
    assert engine.proc.poll() is None
    # a raw ZeroMQ peer without keys gets nothing, not even an error
    peer = RawPeer(address)
    try:
        peer.send_msg(Shutdown("x"))
        assert peer.recv(3) is None
    finally:
        peer.close()


def test_a_refused_first_connection_is_reported_however_late_the_connect_returns():
    """ZeroMQ does not retry a connection whose handshake failed: its one monitor event
    is the only news of it, so the pump watches the socket before connecting it. A
    connect that returns late (a busy machine) must not lose that event."""
    ctx = zmq.Context.instance()
    server = ctx.socket(zmq.ROUTER)
    server.curve_publickey, server.curve_secretkey = zmq.curve_keypair()
    server.curve_server = True
    port = server.bind_to_random_port("tcp://127.0.0.1")
    seen: list[int] = []
    failed = threading.Event()

    def on_event(event: int, endpoint: str) -> None:
        seen.append(event)
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            failed.set()

    def connect_slowly(sock: zmq.Socket) -> None:
        sock.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(0.3)  # the handshake fails meanwhile

    pump = SocketPump(
        lambda c: c.socket(zmq.DEALER),
        connect_slowly,
        lambda frames: None,
        monitor_events=zmq.EVENT_ALL,
        on_event=on_event,
    )
    pump.start()
    try:
        assert failed.wait(10), f"events seen: {seen}"
    finally:
        pump.close()
        server.close(linger=0)
