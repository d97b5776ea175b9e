"""Model runners, one file each, chosen by ``--model``."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from .base import ModelRunner, RunnerOptions, RunnerRow, closing_bias

if TYPE_CHECKING:
    from tokenization import Tokenizer

# name -> "module:Class"; any other --model value is a local Hugging Face directory.
_RUNNERS: dict[str, str] = {
    "random": "engine_core.runners.random_logits:RandomLogitsRunner",
    "scripted": "engine_core.runners.scripted:ScriptedRunner",
}


def runner_names() -> list[str]:
    return sorted(_RUNNERS)


def create_runner(model: str, tokenizer: Tokenizer, options: RunnerOptions) -> ModelRunner:
    """The runner for ``--model``: a built-in name or a local model directory."""
    target = _RUNNERS.get(model)
    if target is not None:
        module, _, cls = target.partition(":")
        return getattr(importlib.import_module(module), cls)(tokenizer, options)
    if Path(model).is_dir():
        from .hf import HFRunner

        return HFRunner(tokenizer, options, model)
    raise ValueError(
        f"unknown model {model!r}: use one of {', '.join(runner_names())} "
        "or a local model directory"
    )


__all__ = [
    "ModelRunner",
    "RunnerOptions",
    "RunnerRow",
    "closing_bias",
    "create_runner",
    "runner_names",
]
