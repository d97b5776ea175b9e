"""Engine settings, and the command-line flags that set them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from pathlib import Path


@dataclass
class EngineConfig:
    #: ``random``, ``scripted``, or a local Hugging Face model directory
    model: str = "random"
    #: a bundled vocabulary name or a model directory; default: the model directory,
    #: else qwen3
    tokenizer: str | None = None
    extra_special_tokens: list[str] = field(default_factory=list)
    reasoning_parser: str | None = None
    reasoning_parser_plugin: str | None = None
    max_num_seqs: int = 256
    #: requests held beyond the running batch; one more is refused with an error
    max_waiting: int = 4096
    max_model_len: int = 32768
    seed: int = 0
    #: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (cuda when available)
    device: str = "auto"
    #: where to bind; default: a private ipc:// socket (spawned engines get one)
    address: str | None = None
    allow_remote: bool = False
    #: CURVE key directory (made if missing): only front ends holding a key listed
    #: there may connect, encrypted; required with --allow-remote on TCP (ipc/keys.py)
    curve_keys: str | None = None
    #: a file holding the token a SHUTDOWN message must carry (a spawning client
    #: writes one); without it, SHUTDOWN is refused and only a signal stops the engine
    shutdown_token_file: str | None = None
    #: the engine exits when this process does (set by a client that spawns it)
    parent_pid: int | None = None
    #: a client whose connection answers no heartbeat for this long (its process
    #: stopped, its host or network gone) has its requests dropped; its ZeroMQ
    #: threads answer however busy its Python is, so this only bounds real silence
    client_timeout_s: float = 30.0
    #: outgoing messages queued for a client that does not read, before it is dropped
    client_backlog: int = 10_000
    #: weights and activations of a model directory: auto (bfloat16 on CUDA, else
    #: float32), float32, bfloat16, float16, float64
    dtype: str = "auto"
    #: tokens a forward pass feeds at most; longer prompts are prefilled in chunks
    max_num_batched_tokens: int = 2048
    script: str | None = None
    forward_ms: float = 0.0
    closing_bias: float = 3.0
    #: the random model leans towards writing these texts (tests of XML-style formats)
    ending_texts: list[str] = field(default_factory=list)
    compile_workers: int = 2
    compile_timeout_s: float = 10.0
    grammar_cache_mb: int = 512
    #: a compiled grammar larger than this, serialized, ends its request with an error
    max_compiled_grammar_mb: int = 256
    #: address-space cap of each compile worker
    compile_worker_memory_mb: int = 8192
    max_spec_bytes: int = 1 << 20
    json_max_whitespace: int = 16
    fill_batch_threshold: int = 64
    log_level: str = "INFO"

    def resolved_tokenizer(self) -> str:
        if self.tokenizer:
            return self.tokenizer
        if Path(self.model).is_dir():
            return self.model
        return "qwen3"

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def to_args(self) -> list[str]:
        """The flags that reproduce this config (used to spawn an engine)."""
        args: list[str] = []
        defaults = EngineConfig()
        for f in fields(self):
            value = getattr(self, f.name)
            if value == getattr(defaults, f.name) or value is None:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag)
            elif isinstance(value, list):
                for v in value:
                    args += [flag.removesuffix("s"), str(v)]
            else:
                args += [flag, str(value)]
        return args


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    a = parser.add_argument
    a("--model", default=d.model, help="random | scripted | a local Hugging Face model directory")
    a(
        "--tokenizer",
        default=None,
        help="bundled vocabulary (qwen3, llama3, o200k_harmony, "
        "cl100k_base) or a model directory; default: the model directory, else qwen3",
    )
    a(
        "--extra-special-token",
        dest="extra_special_tokens",
        action="append",
        default=[],
        help="append a special token to the vocabulary (repeatable)",
    )
    a("--reasoning-parser", default=None, help="the reasoning parser that gates grammars")
    a("--reasoning-parser-plugin", default=None, help="module or .py file registering parsers")
    a("--max-num-seqs", type=int, default=d.max_num_seqs)
    a(
        "--max-waiting",
        type=int,
        default=d.max_waiting,
        help="requests held beyond the running batch; more are refused with an error",
    )
    a("--max-model-len", type=int, default=d.max_model_len)
    a("--seed", type=int, default=d.seed)
    a("--device", default=d.device, help="cpu | cuda | cuda:N | auto")
    a("--address", default=None, help="ipc://PATH or tcp://HOST:PORT to bind")
    a(
        "--allow-remote",
        action="store_true",
        help="allow binding a non-loopback TCP address (needs --curve-keys)",
    )
    a(
        "--curve-keys",
        default=None,
        metavar="DIR",
        help="CURVE key directory (made if missing): encrypt, and admit only front ends "
        "holding a client key listed in DIR/clients",
    )
    a(
        "--shutdown-token-file",
        default=None,
        metavar="PATH",
        help="a SHUTDOWN message must carry the token in this file (default: refused)",
    )
    a("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    a(
        "--client-timeout-s",
        type=float,
        default=d.client_timeout_s,
        help="drop a client whose connection answers no heartbeat for this long",
    )
    a(
        "--client-backlog",
        type=int,
        default=d.client_backlog,
        help="messages queued for a client that does not read before the engine drops it",
    )
    a(
        "--dtype",
        default=d.dtype,
        choices=("auto", "float32", "bfloat16", "float16", "float64"),
        help="of a model directory (auto: bfloat16 on CUDA, float32 elsewhere)",
    )
    a(
        "--max-num-batched-tokens",
        type=int,
        default=d.max_num_batched_tokens,
        help="tokens one forward pass feeds at most: longer prompts are prefilled in chunks",
    )
    a("--script", default=None, help="script file of the scripted model")
    a("--forward-ms", type=float, default=d.forward_ms, help="fixed cost per forward (ms)")
    a("--closing-bias", type=float, default=d.closing_bias)
    a(
        "--ending-text",
        dest="ending_texts",
        action="append",
        default=[],
        help="the random model leans towards writing this text (repeatable)",
    )
    a("--compile-workers", type=int, default=d.compile_workers)
    a("--compile-timeout-s", type=float, default=d.compile_timeout_s)
    a("--grammar-cache-mb", type=int, default=d.grammar_cache_mb)
    a(
        "--max-compiled-grammar-mb",
        type=int,
        default=d.max_compiled_grammar_mb,
        help="refuse a grammar whose compiled form, serialized, is larger (the engine needs "
        "several times this to load it)",
    )
    a("--max-spec-bytes", type=int, default=d.max_spec_bytes)
    a(
        "--compile-worker-memory-mb",
        type=int,
        default=d.compile_worker_memory_mb,
        help="address-space cap of each compile worker; a compile past it fails its request",
    )
    a("--json-max-whitespace", type=int, default=d.json_max_whitespace)
    a("--fill-batch-threshold", type=int, default=d.fill_batch_threshold)
    a("--log-level", default=d.log_level)


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(ns, f.name) for f in fields(EngineConfig)})
