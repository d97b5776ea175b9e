"""The command line as a newcomer meets it: help without waiting for torch, every flag
explained, a version, and every mistake in the flags as one line with exit status 2."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.processes import ROOT, child_env, run_cli
from thinkgate.cli import main

HELPS = [[], ["serve"], ["engine"], ["demo"], ["bench"], ["bench", "http"], ["bench", "fill"]]
HEAVY = ("torch", "numpy", "xgrammar", "transformers", "zmq", "uvicorn", "starlette")


@pytest.mark.parametrize("command", HELPS, ids=lambda c: " ".join(c) or "thinkgate")
def test_help_imports_nothing_heavy_and_explains_every_flag(command):
    probe = (
        "import io, contextlib, json, sys\n"
        "from thinkgate.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        f"        code = main({[*command, '--help']!r})\n"
        "    except SystemExit as e:\n"
        "        code = e.code\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps([code, heavy, out.getvalue()]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=child_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    code, heavy, text = json.loads(proc.stdout)
    assert code in (0, None) and text.startswith("usage:")
    assert heavy == [], f"--help imported {heavy}"
    assert "``" not in text
    # every option line says something: its own help, or its default
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^  (-{1,2}[\w-]+)", line)
        if m is None or m.group(1) in ("-h", "--help"):
            continue
        rest = re.sub(r"^  -[^ ]*( [A-Z_{},|\-]+)?(, --?[\w-]+( [A-Z_{},\-]+)?)*", "", line)
        described = rest.strip() or (
            i + 1 < len(lines) and lines[i + 1].startswith(" " * 10) and lines[i + 1].strip()
        )
        assert described, f"{' '.join(command)}: {line.strip()} has no help"


def test_version():
    proc = run_cli(["--version"])
    assert proc.returncode == 0 and re.fullmatch(r"thinkgate \d+\.\d+\.\d+\S*\n", proc.stdout)


# in-process: each mistake is found before anything slow starts
MISTAKES = [
    (["engine", "--tokenizer", "no-such-vocab"], "--tokenizer"),
    (["engine", "--model", "/no/such/model/dir"], "--model"),
    (["engine", "--model", "randm"], "--model"),
    (["engine", "--reasoning-parser", "qwen9"], "--reasoning-parser"),
    (["engine", "--model", "scripted", "--script", "/no/such/script.json"], "--script"),
    (["engine", "--device", "tpu"], "--device"),
    (["engine", "--address", "tcp://8.8.8.8:5555"], "--address"),
    (["serve", "--tokenizer", "no-such-vocab"], "--tokenizer"),
    (["serve", "--tool-call-parser", "hermez"], "--tool-call-parser"),
    (["serve", "--enable-auto-tool-choice"], "--tool-call-parser"),
    (["serve", "--chat-template", "/no/such/template.jinja"], "--chat-template"),
    (["serve", "--port", "70000"], "--port"),
    (["serve", "--tool-parser-plugin", "/no/such/plugin.py"], "--tool-parser-plugin"),
    (["demo", "--script", "/no/such/script.json"], "--script"),
]


@pytest.mark.parametrize(("argv", "flag"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_a_mistake_is_one_line_and_status_2(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"thinkgate {argv[0]}: error: ") and flag in lines[0]


def test_device_cuda_without_cuda_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["engine", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--device cuda" in err and "--device cpu" in err


def test_an_unknown_flag_is_status_2_without_a_traceback():
    proc = run_cli(["serve", "--no-such-flag"])
    assert proc.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_port_in_use_is_one_line_before_the_engine_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.monotonic()
        proc = run_cli(["serve", "--port", str(port), "--device", "cpu"])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in lines[0] and "--port" in lines[0]
    assert time.monotonic() - t0 < 120  # never waited for an engine


def test_plot_without_matplotlib_says_which_extra_before_running():
    probe = (
        "import sys\n"
        "sys.modules['matplotlib'] = None  # as if it were not installed\n"
        "from thinkgate.cli import main\n"
        "sys.exit(main(['bench', 'fill', '--plot', 'x.png']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=child_env(), capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "thinkgate[bench]" in proc.stderr and "Traceback" not in proc.stderr
    assert "timed iterations" not in proc.stdout  # nothing ran


def test_ctrl_c_while_the_engine_starts_is_one_line(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "thinkgate", "serve", "--port", "0", "--device", "cpu"],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert "starting the engine" in first, first
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert "serving on" not in out
