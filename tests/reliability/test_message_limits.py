"""Message limits hold for the whole message, not per frame: a raw ZeroMQ peer's
multipart message of 5 x 60 MiB (each frame under ZeroMQ's per-frame limit) is read
frame by frame, never copied, dropped with its sender; the engine's memory comes
back, and its peak grows by no more than ZeroMQ's own copy of the message. A message
of many small frames is refused without dropping its sender."""

from __future__ import annotations

import time

import pytest

from ipc import DEFAULT_MAX_MESSAGE_BYTES, NOT_GREETED, ErrorNotice, HealthRequest, MsgType

from .conftest import serve
from .support import PACED, RawPeer, background, hwm_kib, rss_kib

MIB = 1 << 20


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve(
        ["--model", "random", "--max-num-seqs", "16", "--compile-workers", "0", *PACED],
        tmp_path_factory,
        "limits",
    )


def test_a_multipart_message_over_the_limit_is_dropped_uncopied(served):
    frame, parts = 60 * MIB, 5  # each frame passes ZeroMQ's check; the message does not
    assert frame < DEFAULT_MAX_MESSAGE_BYTES < frame * parts
    pid = served.engine.pid
    # the engine's one-time allocations (the core and the guard table load after the
    # handshake; the first grammars compile) happen before memory is measured
    with background(served.loop, served.client):
        time.sleep(3)
    with background(served.loop, served.client):
        peer = RawPeer(served.client.address)
        try:
            peer.hello()
            peer.health(1)
            rss_before, hwm_before = rss_kib(pid), hwm_kib(pid)
            log_before = served.engine.log()
            t0 = time.monotonic()
            peer.send([bytes([MsgType.REQUEST])] + [b"\x01" * frame] * parts)
            msg = peer.recv(120)
            took = time.monotonic() - t0
            assert isinstance(msg, ErrorNotice) and "over the engine's limit" in msg.message, msg
            # the sender is dropped: it must say HELLO again
            peer.send_msg(HealthRequest(2))
            msg = peer.recv(30)
            assert isinstance(msg, ErrorNotice) and msg.message == NOT_GREETED, msg
            peer.hello()
            assert peer.health(3)[0].nonce == 3
            time.sleep(0.5)
            rss_after, hwm_after = rss_kib(pid), hwm_kib(pid)
        finally:
            peer.close()
    log = served.engine.log()[len(log_before) :]
    assert f"sent a message of {parts + 1} frames" in log, log[-2000:]
    sent = (frame * parts) >> 10
    peak = hwm_after - max(rss_before, hwm_before)
    print(
        f"\n{parts} x {frame // MIB} MiB message: engine RSS {rss_before // 1024} -> "
        f"{rss_after // 1024} MiB, peak +{max(peak, 0) // 1024} MiB, answered in {took:.1f} s"
    )
    assert rss_after - rss_before < 32 * 1024  # nothing kept
    assert peak < sent + 32 * 1024  # no copy beyond ZeroMQ's own buffer of the message


def test_a_message_of_many_small_frames_is_refused(served):
    peer = RawPeer(served.client.address)
    try:
        peer.hello()
        peer.send([bytes([MsgType.HEALTH])] + [b"\x00"] * 999)
        msg = peer.recv(30)
        assert isinstance(msg, ErrorNotice) and "expected 2 frames" in msg.message, msg
        assert "got 1000" in msg.message
        assert peer.health(4)[0].nonce == 4  # still greeted
    finally:
        peer.close()
