"""One ``thinkgate serve`` with the random model for the session (the load test, the
README's examples, the HTTP benchmark's smoke test share it)."""

from __future__ import annotations

import pytest

from tests.support.http_server import Server

#: the flags of the README's ``thinkgate serve`` line (the port aside)
README_FLAGS = [
    "--model", "random", "--tokenizer", "qwen3", "--reasoning-parser", "qwen3",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
]  # fmt: skip


@pytest.fixture(scope="session")
def random_server():
    s = Server([*README_FLAGS, "--device", "cpu"])
    yield s
    assert s.stop() == 0, s.output
