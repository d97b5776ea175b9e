"""The structured-output settings of an engine, each with its command-line flag.

Each field's metadata holds its ``help`` and, where the flag is not the field name
with dashes, its ``flag`` (the keys `engine_core.options` reads). The engine passes
this object down whole; defaults are stated here only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _opt(default, help: str, **more):  # noqa: A002 - the argparse name
    return field(default=default, metadata={"help": help, **more})


@dataclass(frozen=True, slots=True)
class StructuredOutputConfig:
    max_whitespace: int | None = _opt(
        16,
        "the most whitespace characters in a row between the elements of constrained "
        "JSON, in every constraint (tool calls included; spaces inside strings are content "
        "and not counted), so that a sampler cannot loop on whitespace until max_tokens "
        "(none: unbounded)",
        flag="--json-max-whitespace",
    )
    max_spec_bytes: int = _opt(
        1 << 20, "the largest structured-output spec accepted, in bytes of its text"
    )
    compile_workers: int = _opt(
        2,
        "grammar compile worker processes, which check each grammar within the time and "
        "memory limits before the engine compiles it again; 0: compile in the engine "
        "process itself, once, with no worker to start (each imports torch and xgrammar), "
        "but no isolation: a compile past the time limit fails its request yet cannot be "
        "stopped (it runs on to its end and its result is dropped), and one that exhausts "
        "memory or crashes the compiler takes the engine down",
    )
    compile_timeout_s: float = _opt(
        10.0,
        "a compile that takes longer fails its request (its worker is replaced; with no "
        "workers, the compile runs on in the engine and its result is dropped)",
    )
    grammar_cache_mb: int = _opt(512, "compiled grammars kept for reuse, in MiB")
    max_compiled_grammar_mb: int = _opt(
        256,
        "refuse a grammar whose compiled form takes more memory than this, in MiB",
    )
    compile_worker_memory_mb: int = _opt(
        8192,
        "address-space cap of each compile worker, in MiB; a compile past it fails (no cap "
        "with no workers)",
    )
    fill_batch_threshold: int = _opt(
        128,
        "masks of this many rows or more are filled by threads sharing the rows; fewer, "
        "by a loop on the step's thread (below about 128 rows, handing rows to a thread "
        "and taking turns at Python's lock cost more than the second core gives)",
    )
    fill_threads: int = _opt(
        0,
        "threads of the batched mask fill; 0: one per two CPUs this process may use (its "
        "CPU affinity, or its container's CPU limit where lower), at least 2 and at most 8",
        default_text="0 (auto)",
    )
