"""Work counted, not timed: how many lines of the project's own Python a call runs.

A count is the same on a quiet machine and a loaded one, so a test can compare the
work of two inputs (a parser that rescans its buffer runs more lines per push as the
buffer grows) without timing anything. Only frames of the project's packages are
counted (not the tests', not the standard library's or third parties'); work done
inside C (a regex, ``str.find``) counts as the one line that called it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from .processes import PACKAGES, ROOT

_OURS = tuple(str(ROOT / p) + "/" for p in PACKAGES)


def lines_run(fn: Callable[[], Any]) -> int:
    """How many lines of the project's code ``fn()`` runs (this thread only)."""
    count = 0
    ours: dict[str, bool] = {}

    def local(frame: FrameType, event: str, arg: Any):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def call(frame: FrameType, event: str, arg: Any):
        name = frame.f_code.co_filename
        mine = ours.get(name)
        if mine is None:
            mine = ours[name] = str(Path(name).resolve()).startswith(_OURS)
        return local if mine else None

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count
