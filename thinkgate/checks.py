"""What a command checks before it starts anything slow: each mistake a user can make
in the flags becomes one `UsageError` that names the flag and what to change, instead
of a traceback from deep inside the engine a few seconds later."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine_core.config import EngineConfig
    from frontend.config import FrontendConfig


class UsageError(Exception):
    """A flag that cannot work; the message says which and why."""


def check_engine(config: EngineConfig) -> None:
    """The engine's flags: model, vocabulary, reasoning parser, device, script file,
    address."""
    from engine_core.runners import runner_names
    from ipc import AddressError, check_bind_address
    from tokenization import BUNDLED

    model = config.model
    if model not in runner_names() and not Path(model).is_dir():
        hint = " (no such directory)" if ("/" in model or model.startswith(".")) else ""
        raise UsageError(
            f"--model {model!r}: use {', '.join(runner_names())} or a local model directory{hint}"
        )
    tok = config.resolved_tokenizer()
    if tok not in BUNDLED and not Path(tok).is_dir():
        raise UsageError(
            f"--tokenizer {tok!r}: use a bundled vocabulary ({', '.join(sorted(BUNDLED))}) "
            "or a local model directory"
        )
    script = config.runner_options.get("script")
    if script is not None and not Path(script).is_file():
        raise UsageError(f"--script {script!r}: no such file")
    check_reasoning_parser(config.reasoning_parser, config.reasoning_parser_plugin)
    check_device(config.device)
    if config.address:
        try:
            check_bind_address(config.address, allow_remote=config.allow_remote)
        except AddressError as e:
            raise UsageError(f"--address: {e}") from None


def check_reasoning_parser(name: str | None, plugin: str | None) -> None:
    from reasoning import load_plugin, reasoning_parser_names

    if plugin:
        try:
            load_plugin(plugin)
        except (ImportError, OSError) as e:
            raise UsageError(f"--reasoning-parser-plugin {plugin!r}: {e}") from None
    if name is not None and name not in reasoning_parser_names():
        raise UsageError(
            f"--reasoning-parser {name!r}: unknown; known: {', '.join(reasoning_parser_names())}"
        )


def check_device(device: str) -> None:
    if device in ("cpu", "auto"):
        return
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise UsageError(f"--device {device!r}: use cpu, cuda, cuda:N or auto")
    import torch

    if not torch.cuda.is_available():
        raise UsageError(
            f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; "
            "use --device cpu"
        )
    if ":" in device and int(device[5:]) >= torch.cuda.device_count():
        raise UsageError(
            f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible"
        )


def check_frontend(config: FrontendConfig) -> None:
    """The front end's flags that can be checked before the engine is up."""
    from frontend.config import ConfigError
    from frontend.tool_formats import tool_format_names
    from reasoning import load_plugin

    try:
        config.check()
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if config.tool_parser_plugin:
        try:
            load_plugin(config.tool_parser_plugin)
        except (ImportError, OSError) as e:
            raise UsageError(f"--tool-parser-plugin {config.tool_parser_plugin!r}: {e}") from None
    if config.tool_call_parser and config.tool_call_parser not in tool_format_names():
        raise UsageError(
            f"--tool-call-parser {config.tool_call_parser!r}: unknown; known: "
            f"{', '.join(tool_format_names())}"
        )
    t = config.chat_template
    if t and ("/" in t or t.endswith((".jinja", ".j2"))) and not Path(t).is_file():
        raise UsageError(f"--chat-template {t!r}: no such file")
