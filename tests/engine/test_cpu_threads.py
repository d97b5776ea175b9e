"""The engine process's main thread runs torch's CPU ops serially, so that the model
thread's OpenMP team is the only one (`engine_core.cpu_threads`).

Each case runs in a fresh interpreter with two OpenMP threads: OpenMP teams live as
long as their process, so the test process itself cannot show one being made. Threads
are counted in ``/proc/self/task``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="counts threads in /proc"
)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys, threading
import torch
from engine_core.cpu_threads import serial_torch_on_this_thread

def tasks():
    return len(os.listdir("/proc/self/task"))

serial = sys.argv[1] == "serial" and serial_torch_on_this_thread()
before = tasks()
big = torch.ones(2048, 2048)
big.add_(1.0)  # large enough that torch splits it over its threads
after_main = tasks()
seen = {}

def model_thread():
    seen["threads"] = torch.get_num_threads()
    big.mul_(2.0)
    seen["tasks"] = tasks()

t = threading.Thread(target=model_thread)
t.start()
t.join()
print(json.dumps({
    "serial": serial, "main_threads": torch.get_num_threads(), "before": before,
    "after_main": after_main, "model_threads": seen["threads"], "with_model": seen["tasks"],
    "sum": float(big[0, 0]),
}))
"""


def _run(mode: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_serial_main_thread_makes_no_team_and_leaves_other_threads_parallel():
    got = _run("serial")
    assert got["serial"] is True
    assert got["main_threads"] == 1
    assert got["after_main"] == got["before"]  # the main thread's op started no thread
    assert got["model_threads"] == 2  # another thread keeps torch's default
    # the model thread (one more task) made its own team: one more worker
    assert got["with_model"] == got["before"] + 2
    assert got["sum"] == 4.0  # both ops ran whole


def test_without_it_the_main_thread_makes_a_team():
    """The control: the same large op on the main thread starts an OpenMP worker."""
    got = _run("plain")
    assert got["serial"] is False
    assert got["main_threads"] == 2
    assert got["after_main"] > got["before"]


ENGINE = """
import json, torch
from engine_core import cpu_threads
from engine_core.config import EngineConfig
from engine_core.server import EngineServer
from structured_output.config import StructuredOutputConfig

if ALONE:
    cpu_threads.one_engine_process()  # as server.run_engine does
config = EngineConfig(
    model="random", device="cpu", log_level="WARNING",
    structured_output=StructuredOutputConfig(compile_workers=0),
)
server = EngineServer(config)
try:
    model = server.core._model_thread.submit(torch.get_num_threads).result()
    print(json.dumps({"main": torch.get_num_threads(), "model": model}))
finally:
    server.stop()
    server.serve()  # returns at once: it was stopped; closes what start-up built
"""


@pytest.mark.parametrize("alone", [True, False])
def test_an_engine_alone_in_its_process_builds_its_core_on_a_serial_thread(alone):
    """Alone in its process, the engine's builder thread turns serial and its model
    thread keeps torch's default; in a process that does more, nothing changes."""
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", ENGINE.replace("ALONE", str(alone))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("{"))
    assert json.loads(line) == {"main": 1 if alone else 2, "model": 2}
