"""``thinkgate demo`` runs on a fresh checkout: it spawns the engine, prints every
request's result, and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_and_exits_0():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "thinkgate", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "SCRIPTED model" in out
    for n in range(1, 8):
        assert f"[{n}] " in out
    assert "error" not in out
    assert out.count("finish_reason  tool_calls") >= 5
    assert "finish_reason  stop" in out
    assert "reasoning 0" in out  # the request with thinking off
    # the template's newlines around the thinking are not part of it
    assert 'reasoning      "\\n' not in out and '\\n"\n' not in out
    assert '[0] get_weather {"city": "Berlin", "unit": ' in out
