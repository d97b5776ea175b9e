"""The own options of the built-in models (``--model random`` and ``scripted``).

Each runner names its options class (`ModelRunner.Options`); the classes of the
built-in ones live here, apart from the runners (which import torch), so that their
fields also become command-line flags (``--script FILE``, ``--forward-ms 20``) that
``--help`` lists at once. Any runner, a model directory's included, takes its options
as ``--runner-options JSON`` too; an option the chosen runner does not have stops the
start-up with the list of the ones it has.
"""

from __future__ import annotations

from dataclasses import dataclass

from .options import option


@dataclass(frozen=True)
class SimulatedOptions:
    """Options of both built-in models."""

    forward_ms: float = option(
        0.0, "a fixed cost added to every forward pass, in milliseconds (benchmarks)"
    )
    closing_bias: float = option(
        3.0,
        "added to the logits of tokens that close strings, structures and markers, so "
        "that the outputs end",
    )


@dataclass(frozen=True)
class RandomOptions(SimulatedOptions):
    ending_texts: tuple[str, ...] = option(
        (),
        "a text that ends free text in the formats a test drives (a closing tag spelled "
        "in ordinary tokens, say): the model leans into writing it once begun (repeatable)",
        flag="--ending-text",
        metavar="TEXT",
        default_text="none",
    )


@dataclass(frozen=True)
class ScriptedOptions(SimulatedOptions):
    script: str | None = option(
        None,
        "the script file: JSON rules (a text to match in the prompt, the output to "
        "write) and a default output (see engine_core/runners/scripted.py)",
        metavar="FILE",
        default_text="none: the model writes nothing but its end",
    )


#: the options classes of the built-in models, whose fields are flags too
BUILTIN_MODEL_OPTIONS = (RandomOptions, ScriptedOptions)
