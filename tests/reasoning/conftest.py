"""Vocabularies for the reasoning tests, loaded once per session."""

from __future__ import annotations

import pytest

from tokenization import Tokenizer, load_tokenizer


@pytest.fixture(scope="session")
def qwen3() -> Tokenizer:
    return load_tokenizer("qwen3")


@pytest.fixture(scope="session")
def llama3() -> Tokenizer:
    return load_tokenizer("llama3")


@pytest.fixture(scope="session")
def harmony() -> Tokenizer:
    return load_tokenizer("o200k_harmony")
