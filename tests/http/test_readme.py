"""The README's examples, run as a user would run them: the ``thinkgate serve`` line is
the one the session's server runs, the ``curl`` line and the ``openai`` example talk to
that server, and the Python examples of the engine and the front end run as they are."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from tests.support.processes import ROOT, child_env

from .conftest import README_FLAGS

README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, re.S)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
SERVE = next(code for lang, code in BLOCKS if code.startswith("thinkgate serve"))
CURL = next(code for lang, code in BLOCKS if code.startswith("curl "))
README_URL = "http://127.0.0.1:8000"


def test_the_serve_line_is_the_one_the_tests_run():
    argv = shlex.split(SERVE.splitlines()[0])
    assert argv[:2] == ["thinkgate", "serve"]
    flags = argv[2:]
    i = flags.index("--port")
    assert flags[i + 1] == "8000"
    assert flags[:i] + flags[i + 2 :] == README_FLAGS
    assert f"thinkgate serving on {README_URL}" in SERVE


def test_the_curl_line(random_server):
    assert README_URL in CURL
    proc = subprocess.run(
        ["bash", "-c", CURL.replace(README_URL, random_server.url)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    choice = json.loads(proc.stdout)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and isinstance(json.loads(call["arguments"])["city"], str)


def _run_python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def test_the_openai_client_example(random_server):
    (code,) = [c for c in PYTHON if "import openai" in c]
    assert README_URL + "/v1" in code
    out = _run_python(code.replace(README_URL, random_server.url))
    assert "forecast: {" in out or "cut short (length)" in out
    assert "refused: " in out and "'get_time', which is not among the tools" in out


@pytest.mark.parametrize("marker", ["parser.split", "ChatFrontend.create"])
def test_the_python_examples(marker):
    (code,) = [c for c in PYTHON if marker in c and "import openai" not in c]
    out = _run_python(code)
    first = out.split()[0]
    assert first in ("stop", "length", "tool_calls", "error"), out
