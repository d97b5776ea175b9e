"""``thinkgate engine`` alone, and ``thinkgate serve --engine-address`` joining it: an
engine that holds as many requests as it may answers the next with 503 and
``Retry-After``; stopping the server leaves the engine it joined running."""

from __future__ import annotations

import signal

import httpx
import openai
import pytest

from ipc import private_ipc_address
from tests.support.http_server import Process, Server


@pytest.fixture(scope="module")
def engine():
    address, own_dir = private_ipc_address()
    e = Process(
        [
            "engine", "--model", "random", "--tokenizer", "qwen3", "--device", "cpu",
            "--max-num-seqs", "1", "--max-waiting", "0", "--address", address,
            "--compile-workers", "0",
        ],
        r"thinkgate engine listening on (\S+)",
    )  # fmt: skip
    assert e.match is not None and e.match.group(1) == address
    yield e
    e.proc.send_signal(signal.SIGTERM)
    assert e.proc.wait(60) == 0, e.output
    e.kill()
    own_dir.rmdir() if own_dir.exists() and not any(own_dir.iterdir()) else None


def test_a_full_engine_is_503_with_retry_after_and_the_engine_outlives_the_server(engine):
    server = Server(["--engine-address", engine.match.group(1)])
    try:
        assert "joining the engine" in server.output
        with openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
            long = c.chat.completions.create(
                model="random",
                messages=[{"role": "user", "content": "go on"}],
                max_tokens=30000,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            next(iter(long))  # it runs: the engine now holds all it may
            with pytest.raises(openai.InternalServerError) as e:
                c.chat.completions.create(
                    model="random", messages=[{"role": "user", "content": "me too"}]
                )
            assert e.value.status_code == 503
            assert e.value.response.headers["retry-after"].isdigit()
            assert "full" in str(e.value)
            long.close()
    finally:
        assert server.stop() == 0, server.output
    assert engine.proc.poll() is None, "the server stopped an engine it did not start"
    assert "stopping the engine" not in server.output
    # and a new server joins the same engine
    again = Server(["--engine-address", engine.match.group(1)])
    try:
        assert httpx.get(again.url + "/health", timeout=30).status_code == 200
    finally:
        again.proc.send_signal(signal.SIGINT)  # Ctrl-C: as clean as SIGTERM
        assert again.stop() == 0, again.output
