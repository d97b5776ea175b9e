"""Engines for the reliability tests: each module starts its own, as an operator would
(``python -m engine_core``), with its log in a file the tests read."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from tests.support.engine import Served


def serve(
    args: Sequence[str], tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[Served]:
    log = tmp_path_factory.mktemp(name) / "engine.log"
    served = Served(args, log)
    try:
        yield served
    finally:
        code = served.close()
        print(f"{name}: engine exited with {code}; log at {log}")
