"""Model runners, one file each, chosen by ``--model``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from registry import Registry

from .base import ModelRunner, RunnerOptions, RunnerRow, closing_bias

if TYPE_CHECKING:
    from tokenization import Tokenizer

# The built-in models; any other --model value is a local Hugging Face directory.
RUNNERS: Registry[ModelRunner] = Registry(
    "model runner",
    ModelRunner,
    {
        "random": "engine_core.runners.random_logits:RandomLogitsRunner",
        "scripted": "engine_core.runners.scripted:ScriptedRunner",
    },
)


def runner_names() -> list[str]:
    return RUNNERS.names()


def create_runner(model: str, tokenizer: Tokenizer, options: RunnerOptions) -> ModelRunner:
    """The runner for ``--model``: a built-in name or a local model directory."""
    if model in RUNNERS:
        return RUNNERS.get(model)(tokenizer, options)
    if Path(model).is_dir():
        from .hf import HFRunner

        return HFRunner(tokenizer, options, model)
    raise ValueError(
        f"unknown model {model!r}: use one of {', '.join(runner_names())} "
        "or a local model directory"
    )


__all__ = [
    "RUNNERS",
    "ModelRunner",
    "RunnerOptions",
    "RunnerRow",
    "closing_bias",
    "create_runner",
    "runner_names",
]
