"""Shared fixtures: real vocabularies, loaded once per session; and OpenMP's wait
policy for the run."""

from __future__ import annotations

import os

import pytest

# Before torch loads: the suite runs many processes on few cores (two pytest workers,
# the engines and compile workers they spawn), where OpenMP threads that spin between
# parallel ops only take CPU from the others (tests/engine: 142 s and 275 CPU-s with
# spinning, 110 s and 212 CPU-s without). Processes inherit it. An engine in service
# keeps OpenMP's default (engine_core/cpu_threads.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tokenization import Tokenizer, load_tokenizer


@pytest.fixture(scope="session")
def qwen3() -> Tokenizer:
    return load_tokenizer("qwen3")


@pytest.fixture(scope="session")
def harmony() -> Tokenizer:
    return load_tokenizer("o200k_harmony")


@pytest.fixture(scope="session")
def llama3() -> Tokenizer:
    return load_tokenizer("llama3")
