"""Engine settings, and the command-line flags that set them.

One frozen object per concern: `EngineConfig` (the process: model, batch, device,
sockets) holds a `StructuredOutputConfig` (grammars: compile, cache, masks) and the
model runner's own options, and is passed down whole. Each field states its default,
flag and help once (`engine_core.options.option`); `add_engine_arguments`,
`config_from_args` and `EngineConfig.to_args` are all derived from that table.

No heavy imports here: ``python -m engine_core --help`` parses its flags before
torch or xgrammar load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structured_output.config import StructuredOutputConfig

from .model_options import BUILTIN_MODEL_OPTIONS
from .options import option

#: device nodes of the NVIDIA and AMD drivers (and of WSL's GPU bridge): torch can see
#: a GPU only where one of them exists
_GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


class StartupError(Exception):
    """The engine cannot start with these settings on this machine; the message says
    which setting and why (shown as one line, without a traceback)."""


@dataclass(frozen=True)
class EngineConfig:
    model: str = option(
        "random",
        "random or scripted (the built-in test models), or a local Hugging Face model directory",
        metavar="NAME_OR_DIR",
    )
    runner_options: dict[str, Any] = option(
        {},
        "the model runner's own options, as a JSON object (the built-in models take "
        'options such as {"forward_ms": 20}); a key the runner does not know stops the '
        "start-up with the list of its options",
        metavar="JSON",
        default_text="{}",
    )
    tokenizer: str | None = option(
        None,
        "a bundled vocabulary (qwen3, llama3, o200k_harmony, cl100k_base) or a model directory",
        metavar="NAME_OR_DIR",
        default_text="the model directory, else qwen3",
    )
    extra_special_tokens: tuple[str, ...] = option(
        (),
        "append a special token to the vocabulary (repeatable)",
        flag="--extra-special-token",
        metavar="TEXT",
        default_text="none",
    )
    reasoning_parser: str | None = option(
        None,
        "the reasoning parser that finds the end of thinking; grammars apply after it",
        metavar="NAME",
        default_text="none: grammars apply from the first token",
    )
    reasoning_parser_plugin: str | None = option(
        None,
        "a module or .py file that registers more reasoning parsers",
        metavar="PATH",
        default_text="none",
    )
    max_num_seqs: int = option(256, "requests in the running batch at most")
    max_waiting: int = option(
        4096, "requests held beyond the running batch; more are refused with an error"
    )
    max_model_len: int = option(32768, "prompt plus max_tokens of a request, at most")
    seed: int = option(0, "seed of the model runner and of requests that set none")
    device: str = option(
        "auto", "cpu, cuda, cuda:N, or auto (cuda when available)", metavar="DEVICE"
    )
    address: str | None = option(
        None,
        "ipc://PATH or tcp://HOST:PORT to bind",
        metavar="ADDRESS",
        default_text="a private ipc:// socket in a new temporary folder",
    )
    allow_remote: bool = option(
        False, "allow binding a non-loopback TCP address (needs --curve-keys)"
    )
    curve_keys: str | None = option(
        None,
        "CURVE key directory (made if missing): encrypt, and admit only front ends "
        "holding a client key listed in DIR/clients (see ipc/keys.py)",
        metavar="DIR",
        default_text="none: no encryption; refused with --allow-remote on TCP",
    )
    shutdown_token_file: str | None = option(
        None,
        "a SHUTDOWN message must carry the token in this file (a spawning client writes one)",
        metavar="PATH",
        default_text="none: SHUTDOWN is refused, only a signal stops the engine",
    )
    parent_pid: int | None = option(
        None, "exit when this process does (set by a client that spawns the engine)", hidden=True
    )
    client_timeout_s: float = option(
        30.0,
        "drop a client whose connection answers no heartbeat for this long, in seconds "
        "(its process stopped, its host or network gone)",
    )
    client_backlog: int = option(
        10_000, "messages queued for a client that does not read before the engine drops it"
    )
    dtype: str = option(
        "auto",
        "weights and activations of a model directory (auto: bfloat16 on CUDA, else float32)",
        choices=("auto", "float32", "bfloat16", "float16", "float64"),
        metavar="DTYPE",
    )
    max_num_batched_tokens: int = option(
        2048,
        "tokens one forward pass feeds at most, decoding rows first; a longer prompt is "
        "prefilled in chunks over several steps",
    )
    jump_forward: bool = option(
        False,
        "append the text a request's grammar forces as tokens without sampling them (the "
        "tokenizer's own split, up to a safe boundary); off by default: a model under a "
        "mask may split that text otherwise, so a greedy output can change",
    )
    draft_tokens: int = option(
        0,
        "draft tokens proposed per request and step by prompt lookup (the tokens that "
        "followed the last few tokens earlier in the prompt or output), scored in the "
        "same forward pass and kept only where the model's sampling and the grammar "
        "would have chosen them; 0: no drafts",
        metavar="K",
    )
    structured_output: StructuredOutputConfig = dataclasses.field(
        default_factory=StructuredOutputConfig
    )
    log_level: str = option("INFO", "DEBUG, INFO, WARNING or ERROR", metavar="LEVEL")

    def resolved_tokenizer(self) -> str:
        if self.tokenizer:
            return self.tokenizer
        if Path(self.model).is_dir():
            return self.model
        return "qwen3"

    def resolved_device(self) -> str:
        """``device`` made concrete; `StartupError` for one this machine lacks. Without
        a GPU driver this is known without importing torch (a second or more)."""
        if self.device == "cpu":
            return "cpu"
        has_driver = any(os.path.exists(p) for p in _GPU_NODES)
        if self.device == "auto":
            if not has_driver:
                return "cpu"
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        kind, _, index = self.device.partition(":")
        if kind != "cuda" or (index and not index.isdigit()):
            raise StartupError(f"--device {self.device!r}: use cpu, cuda, cuda:N or auto")
        if not has_driver:
            raise StartupError(
                f"--device {self.device}: CUDA is not available here (no GPU driver is visible)"
            )
        import torch

        if not torch.cuda.is_available():
            why = "no GPU is visible" if torch.version.cuda else "torch is built without CUDA"
            raise StartupError(f"--device {self.device}: CUDA is not available here ({why})")
        if index and int(index) >= torch.cuda.device_count():
            raise StartupError(
                f"--device {self.device}: this machine has {torch.cuda.device_count()} "
                "CUDA device(s)"
            )
        return self.device

    def to_args(self) -> list[str]:
        """The flags that reproduce this config (used to spawn an engine), each as
        ``--flag=value`` (a value that starts with a dash stays a value)."""
        args: list[str] = []
        for _, f, declared, value in _walk(self):
            default = _default_of(f)
            if value == default:
                continue
            flag, hint = flag_of(f), _base(declared)
            if hint is bool:
                if value:
                    args.append(flag)
            elif value is None:
                if not _spells_none(f, declared):
                    raise ValueError(f"{flag} cannot be set back to none on the command line")
                args.append(f"{flag}={NONE}")
            elif _origin(hint) is tuple:
                args += [f"{flag}={v}" for v in value]
            elif _origin(hint) is dict:
                args.append(f"{flag}={json.dumps(value)}")
            else:
                args.append(f"{flag}={value}")
        return args


# ----- the table, walked -----------------------------------------------------------


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _default_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _origin(hint: Any) -> Any:
    return typing.get_origin(hint) or hint


def _optional(hint: Any) -> bool:
    """Whether ``hint`` is ``X | None``."""
    return (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) and type(
        None
    ) in typing.get_args(hint)


def _base(hint: Any) -> Any:
    """``X`` of ``X | None``."""
    if _optional(hint):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


#: how the command line spells None, for a setting that may be None but is not by
#: default (``--json-max-whitespace none``)
NONE = "none"


def _spells_none(f: dataclasses.Field, declared: Any) -> bool:
    return _optional(declared) and _default_of(f) is not None


def _fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """``(dest, field, declared type)`` of every setting, nested configs flattened;
    ``dest`` is the field name at the top and ``outer.name`` below."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(_base(hint)):
            yield from _fields(_base(hint), f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, hint


def _walk(config: Any) -> Iterator[tuple[str, dataclasses.Field, Any, Any]]:
    """`_fields` with each one's value in ``config``."""
    for dest, f, hint in _fields(type(config)):
        obj = config
        for part in dest.split(".")[:-1]:
            obj = getattr(obj, part)
        yield dest, f, hint, getattr(obj, f.name)


# ----- argparse ------------------------------------------------------------------


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


#: how ``--help`` names a flag's value, by type (a field's ``metavar`` overrides it)
_METAVARS = {int: "N", float: "NUMBER", str: "TEXT"}


def _or_none(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text == NONE else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse's error names it
    return parse


class _Store(argparse.Action):
    """Stores one value. Python's argparse before 3.13 takes a value of exactly
    ``--`` (``--tokenizer=--``, as `EngineConfig.to_args` writes it) for the end of
    the options and hands the action no value at all: the value is put back here,
    converted and checked like any other."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, self._value(values))

    def _value(self, values: Any) -> Any:
        if values != []:
            return values
        try:
            value = self.type("--") if self.type else "--"
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            raise argparse.ArgumentError(self, f"invalid value: '--' ({e})") from None
        if self.choices is not None and value not in self.choices:
            raise argparse.ArgumentError(self, "invalid choice: '--'")
        return value


class _Append(_Store):
    """Appends one value per use of the flag (``--`` kept, as by `_Store`)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        setattr(namespace, self.dest, [*items, self._value(values)])


def _add(
    group: argparse._ActionsContainer,
    dest: str,
    f: dataclasses.Field,
    declared: Any,
    *,
    given_only: bool = False,
) -> None:
    """The argparse flag of one setting. ``given_only``: its default is None (not
    given), whatever the setting's own default (which the help text shows)."""
    hint = _base(declared)
    meta = f.metadata
    if "help" not in meta:
        raise TypeError(f"setting {dest} has no help text")
    default = _default_of(f)
    if meta.get("hidden"):
        help_text = argparse.SUPPRESS
    else:
        shown = meta.get("default_text")
        if shown is None:
            shown = ("on" if default else "off") if hint is bool else str(default)
        help_text = f"{meta['help']} (default: {shown})".replace("%", "%%")
    kwargs: dict[str, Any] = {"dest": dest, "help": help_text}
    if hint is not bool:
        kwargs["metavar"] = meta.get("metavar") or _METAVARS.get(hint, "VALUE")
    if "choices" in meta:
        kwargs["choices"] = meta["choices"]
    origin = _origin(hint)
    if hint is bool:
        if default:
            raise TypeError(f"setting {dest}: a flag that is on by default cannot be turned off")
        kwargs.update(action="store_true", default=False)
    elif origin is tuple:
        kwargs.update(action=_Append, type=typing.get_args(hint)[0], default=None)
    elif origin is dict:
        kwargs.update(action=_Store, type=_json_object, default=None)
    elif _spells_none(f, declared):
        kwargs.update(action=_Store, type=_or_none(hint), default=default)
    else:
        kwargs.update(action=_Store, type=hint, default=default)
    if given_only:
        kwargs["default"] = None
    group.add_argument(flag_of(f), **kwargs)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every setting of `EngineConfig`, structured-output ones in a
    group of their own, and one for each option of the built-in models (gathered into
    ``runner_options``)."""
    groups: dict[str, argparse._ActionsContainer] = {"": parser}
    for dest, f, hint in _fields(EngineConfig):
        outer = dest.rpartition(".")[0]
        if outer not in groups:
            groups[outer] = parser.add_argument_group(outer.replace("_", " ") + " settings")
        _add(groups[outer], dest, f, hint)
    group = parser.add_argument_group(
        "options of the built-in models (--model random, scripted)",
        "each also settable in --runner-options; a model refuses an option it does not have",
    )
    for dest, f, hint in _model_option_fields():
        _add(group, dest, f, hint, given_only=True)


def _model_option_fields() -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """The fields of the built-in models' options, each once, by name."""
    seen: set[str] = set()
    for cls in BUILTIN_MODEL_OPTIONS:
        for dest, f, hint in _fields(cls, _RUNNER_PREFIX):
            if dest not in seen:
                seen.add(dest)
                yield dest, f, hint


_RUNNER_PREFIX = "runner_options."


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    """The config that the flags of `add_engine_arguments` describe. A built-in
    model's option given as a flag joins ``--runner-options`` (and wins over it)."""
    config = _build(EngineConfig, ns)
    given = {}
    for dest, _, hint in _model_option_fields():
        value = getattr(ns, dest, None)
        if value is not None:
            given[dest[len(_RUNNER_PREFIX) :]] = list(value) if _origin(hint) is tuple else value
    if given:
        config = dataclasses.replace(config, runner_options={**config.runner_options, **given})
    return config


def _build(cls: type, ns: argparse.Namespace, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = _base(hints[f.name])
        if dataclasses.is_dataclass(hint):
            kwargs[f.name] = _build(hint, ns, f"{prefix}{f.name}.")
            continue
        value = getattr(ns, prefix + f.name)
        origin = _origin(hint)
        if origin in (tuple, dict):  # a repeatable flag, or JSON: None when not given
            value = _default_of(f) if value is None else origin(value)
        kwargs[f.name] = value
    return cls(**kwargs)
