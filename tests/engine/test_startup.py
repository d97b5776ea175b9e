"""Start-up failures (issue 12.5) and stopping (issue 12.4): ``python -m engine_core``
either serves, or says in one line why it cannot and exits with code 2; interrupted
while loading, it exits the same way; stopped, it ends every request and exits. In
every case nothing is left behind: no file in the temp folder, no process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from engine_core.config import EngineConfig
from engine_core.engine import EngineCore
from ipc import FinishReason
from structured_output.config import StructuredOutputConfig
from tests.support.processes import ROOT

PROG = "python -m engine_core"


def _marked(mark: str) -> list[int]:
    """Processes whose environment holds ``mark`` (the engine's compile workers
    inherit it)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes()
            state = (p / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if mark.encode() in env and state != "Z":
            out.append(int(p.name))
    return out


class Engine:
    """``python -m engine_core`` with a temp folder and an environment mark of its own."""

    def __init__(self, args: list[str], tmp_path: Path) -> None:
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        self.mark = f"THINKGATE_TEST_{uuid.uuid4().hex}"
        env = dict(os.environ, TMPDIR=str(self.tmp), PYTHONPATH=str(ROOT), **{self.mark: "1"})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_core", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )

    def wait_for_line(self, stream: str, text: str, timeout_s: float = 120) -> list[str]:
        """Lines of stdout or stderr read up to the first that contains ``text``."""
        f = getattr(self.proc, stream)
        lines: list[str] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = f.readline()
            if not line:
                raise AssertionError(f"no {text!r} on {stream}; got {lines}")
            lines.append(line.rstrip("\n"))
            if text in line:
                return lines
        raise AssertionError(f"no {text!r} within {timeout_s} s")

    def finish(self, timeout_s: float = 60) -> tuple[int, list[str]]:
        _, err = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, err.splitlines()

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 3
        while _marked(self.mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _marked(self.mark) == [], "processes left behind"
        assert list(self.tmp.iterdir()) == [], "files left in the temp folder"


def _one_error_line(err: list[str], *words: str) -> None:
    assert not any("Traceback" in line for line in err), "\n".join(err)
    errors = [line for line in err if line.startswith(f"{PROG}: error:")]
    assert len(errors) == 1, "\n".join(err)
    for w in words:
        assert w in errors[0], errors[0]


def _cases(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    return {
        "unknown tokenizer": (["--tokenizer", "nosuch"], ["tokenizer 'nosuch'", "bundled"]),
        "missing model directory": (
            ["--model", str(tmp_path / "no-model")],
            ["unknown model", "no-model"],
        ),
        "unknown reasoning parser": (
            ["--reasoning-parser", "nosuch"],
            ["reasoning parser 'nosuch'", "qwen3"],
        ),
        "unknown runner option": (
            ["--runner-options", '{"nosuch": 1}'],
            ["'nosuch'", "forward_ms"],
        ),
        "missing script": (
            ["--model", "scripted", "--runner-options", json.dumps({"script": "/no/such.json"})],
            ["/no/such.json"],
        ),
        "missing plugin": (
            ["--reasoning-parser-plugin", "no_such_plugin_module"],
            ["no_such_plugin_module"],
        ),
        "remote address": (["--address", "tcp://192.0.2.1:5555"], ["--allow-remote"]),
        "bad device": (["--device", "tpu"], ["--device 'tpu'"]),
    }


CASES = list(_cases(Path("/x")))


@pytest.mark.parametrize("case", CASES)
def test_a_startup_error_is_one_line_exit_2_and_leaves_nothing(case, tmp_path):
    args, words = _cases(tmp_path)[case]
    engine = Engine([*args, "--compile-workers", "1"], tmp_path)
    code, err = engine.finish()
    assert code == 2, "\n".join(err)
    _one_error_line(err, *words)
    engine.assert_nothing_left()


def test_cuda_without_cuda_is_one_line_exit_2(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    engine = Engine(["--device", "cuda"], tmp_path)
    code, err = engine.finish()
    assert code == 2
    _one_error_line(err, "--device cuda", "CUDA is not available")
    engine.assert_nothing_left()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_while_loading(sig, tmp_path):
    """The signal lands while the model and the grammar compilers start."""
    engine = Engine(["--reasoning-parser", "qwen3"], tmp_path)
    engine.wait_for_line("stderr", "starting model random")
    engine.proc.send_signal(sig)
    code, err = engine.finish()
    assert code == 2, "\n".join(err)
    _one_error_line(err, "interrupted while starting")
    engine.assert_nothing_left()


def test_a_failure_after_the_compile_workers_started_stops_them(qwen3, monkeypatch):
    """In process: the mask buffers cannot be made (after the compile workers were
    started): start-up fails, and the workers are gone."""
    import structured_output.manager as manager

    def no_buffers(*args, **kwargs):
        raise MemoryError("injected: no memory for the mask buffers")

    monkeypatch.setattr(manager, "BitmaskFiller", no_buffers)
    mark = f"THINKGATE_TEST_{uuid.uuid4().hex}"
    monkeypatch.setenv(mark, "1")
    config = EngineConfig(structured_output=StructuredOutputConfig(compile_workers=2))
    with pytest.raises(MemoryError):
        EngineCore(config, qwen3, device="cpu")
    assert _marked(mark) == []


# ----- stopping -------------------------------------------------------------------------


def _exit_after_sigterm(engine: Engine, requests: int) -> tuple[float, list]:
    """Connect, run ``requests`` long requests (every other one under a grammar) until
    each has sent output, SIGTERM; the exit time and every request's outputs."""
    from engine_core.client import EngineClient
    from ipc import EngineCoreRequest, SamplingParams, StructuredOutputSpec

    address = engine.wait_for_line("stdout", "listening on")[-1].split("listening on ")[1]

    async def body():
        client = await EngineClient.connect(address, timeout_s=60)
        try:
            prompt = client.tokenizer().encode("<|im_start|>user\nhi<|im_end|>\n")
            schema = json.dumps({"type": "array", "items": {"type": "string"}})
            started = asyncio.Semaphore(0)

            async def one(i: int):
                spec = StructuredOutputSpec("json_schema", schema) if i % 2 else None
                req = EngineCoreRequest(
                    f"r{i}", prompt, SamplingParams(max_tokens=30_000, ignore_eos=True), spec
                )
                outs = []
                async for o in client.generate(req):
                    if not outs:
                        started.release()
                    outs.append(o)
                return outs

            tasks = [asyncio.create_task(one(i)) for i in range(requests)]
            for _ in range(requests):
                await asyncio.wait_for(started.acquire(), 120)
            t0 = time.monotonic()
            engine.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(engine.proc.wait, 60)
            took = time.monotonic() - t0
            return took, await asyncio.wait_for(asyncio.gather(*tasks), 30)
        finally:
            await client.close()

    return asyncio.run(body())


@pytest.mark.parametrize("requests", [0, 24], ids=["idle", "under load"])
def test_sigterm_ends_every_request_and_exits_leaving_nothing(requests, tmp_path):
    """Each request gets one final output: the ones still running at the signal (the
    unconstrained ones, at least: nothing ends them before 30,000 tokens) are aborted
    with an error saying the engine shut down. The exit times are measured by ``python
    -m bench.shutdown``; the bound here is the container runtimes' 10 s, with room for
    a loaded machine."""
    engine = Engine([], tmp_path)
    took, streams = _exit_after_sigterm(engine, requests)
    code, err = engine.finish()
    assert code == 0, "\n".join(err)
    assert len(streams) == requests
    for i, outs in enumerate(streams):
        finals = [o for o in outs if o.finished]
        assert len(finals) == 1 and outs[-1] is finals[0]
        if finals[0].error is not None or i % 2 == 0:
            assert finals[0].finish_reason == FinishReason.ABORT
            assert finals[0].error == "the engine shut down"
    engine.assert_nothing_left()
    assert took < 10
