"""Our commands as real processes: the tree's root, the environment a child needs to
import this tree, a ``thinkgate`` command in the background waited for until it prints
its ready line (stopped with SIGTERM), and a ``thinkgate`` command run to its end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the project's packages, bottom of the import graph first (bench, which measures
#: them, and the tests excluded)
PACKAGES = (
    "registry",
    "tokenization",
    "ipc",
    "reasoning",
    "structured_output",
    "engine_core",
    "frontend",
    "thinkgate",
)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("THINKGATE_API_KEY", None)
    env.update(extra or {})
    return env


class Process:
    """A thinkgate command running in the background; its output is collected."""

    def __init__(
        self,
        args: list[str],
        ready: str,
        *,
        env: dict[str, str] | None = None,
        timeout_s: float = 240.0,
    ) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "thinkgate", *args],
            cwd=ROOT,
            env=child_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._ready = threading.Event()
        self._pattern = re.compile(ready)
        self.match: re.Match[str] | None = None
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr), daemon=True),
        ]
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"thinkgate {' '.join(args)} did not come up (exit {self.proc.returncode}):\n"
                    + self.output
                )

    def _read(self, stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)
            m = self._pattern.search(line)
            if m is not None and not self._ready.is_set():
                self.match = m
                self._ready.set()

    @property
    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, and the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close()

    def _close(self) -> None:
        for t in self._threads:
            t.join(10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def run_cli(args: list[str], *, timeout_s: float = 120.0, **kwargs) -> subprocess.CompletedProcess:
    """``thinkgate ARGS`` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "thinkgate", *args],
        cwd=ROOT,
        env=child_env(kwargs.pop("env", None)),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        **kwargs,
    )


def thread_cpu_ticks(native_id: int) -> int:
    """User plus system clock ticks of one thread of this process (Linux)."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime
