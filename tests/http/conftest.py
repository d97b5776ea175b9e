"""One ``thinkgate serve`` with the random model for the session (the load test, the
README's examples, the HTTP benchmark's smoke test share it)."""

from __future__ import annotations

import os

import pytest

from tests.support.http_server import Server

#: the flags of the README's ``thinkgate serve`` line (the port aside)
README_FLAGS = [
    "--model", "random", "--tokenizer", "qwen3", "--reasoning-parser", "qwen3",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
]  # fmt: skip


@pytest.fixture(scope="session")
def random_server():
    s = Server(
        [*README_FLAGS, "--device", "cpu", "--compile-workers", "0", "--compile-timeout-s", "60"]
    )
    yield s
    assert s.stop() == 0, s.output
    assert not _alive(s.engine_pid), "the engine outlived the server that started it"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone too
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"
