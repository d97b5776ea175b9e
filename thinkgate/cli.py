"""The thinkgate command: serve, engine, demo, bench and make-model.

Arguments are parsed before anything heavy is imported (torch, the grammar compiler,
the model), so ``--help`` and a mistyped flag answer at once. A mistake in the flags
is one line naming the flag, and exit status 2; Ctrl-C before a command is up is one
line too, and exit status 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

DESCRIPTION = "Engine core for structured outputs and forced tool calls with reasoning models."


def _worth_saying(default: object) -> bool:
    if default is None or default is False or default is argparse.SUPPRESS:
        return False
    return default not in ([], "")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option says its default, when it has one worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            _worth_saying(action.default)
            and "%(default)" not in text
            and "default" not in text
            and action.option_strings
        ):
            text = f"{text} (default: %(default)s)" if text else "default: %(default)s"
        return text


def _say_defaults(p: argparse.ArgumentParser) -> None:
    """Options without a help text still show their default (argparse prints nothing
    for an option whose help is empty)."""
    for action in p._actions:
        if action.help is None and _worth_saying(action.default):
            action.help = "default: %(default)s"


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("thinkgate")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


# ----- the commands' flags -------------------------------------------------------------


def _engine_flags(p: argparse.ArgumentParser) -> None:
    from engine_core.config import add_engine_arguments

    add_engine_arguments(p)


def _serve_flags(p: argparse.ArgumentParser) -> None:
    from engine_core.config import add_engine_arguments
    from frontend.config import add_frontend_arguments

    add_engine_arguments(p)
    add_frontend_arguments(p, reasoning_flags=False)
    g = p.add_argument_group("HTTP server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on")
    g.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free one)")
    g.add_argument(
        "--api-key",
        default=os.environ.get("THINKGATE_API_KEY"),
        metavar="KEY",
        help="refuse /v1 requests without 'Authorization: Bearer KEY' (default: the "
        "THINKGATE_API_KEY environment variable; unset: no key)",
    )
    g.add_argument(
        "--engine-address",
        default=None,
        metavar="ADDR",
        help="join the engine already running at ADDR (its 'listening on' line) instead of "
        "starting one; the engine flags above are then the engine's own",
    )
    g.add_argument(
        "--engine-timeout-s",
        type=float,
        default=30.0,
        help="an engine silent this long is taken for dead (one that exits is seen at once)",
    )
    g.add_argument(
        "--uvicorn-log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level of the HTTP server (uvicorn)",
    )


def _demo_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--script",
        default=None,
        metavar="FILE",
        help="a script file of your own (see engine_core/runners/scripted.py)",
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="a local model directory instead of the scripted model (thinkgate make-model "
        "writes one)",
    )
    p.add_argument("--max-tokens", type=int, default=96, help="per answer, with --model")
    p.add_argument(
        "--device", default="auto", help="with --model: cpu, cuda, cuda:N or auto", metavar="DEVICE"
    )
    p.add_argument(
        "--tool-parser-plugin",
        default=None,
        metavar="PATH",
        help="module or .py file that registers more tool-call formats",
    )


# ----- running them -----------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from engine_core.config import config_from_args
    from frontend.config import ConfigError, frontend_config_from_args
    from frontend.serve import ServerConfig, StartupError, serve

    from .checks import UsageError, check_engine, check_frontend

    engine = config_from_args(args)
    try:
        frontend = frontend_config_from_args(args)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if args.port and not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port}: use a port in 1-65535 (or 0: any free one)")
    if not args.engine_address:
        check_engine(engine)
    check_frontend(frontend)
    server = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        engine_address=args.engine_address,
        engine_timeout_s=args.engine_timeout_s,
        log_level=args.uvicorn_log_level,
    )
    try:
        return asyncio.run(serve(engine, frontend, server))
    except StartupError as e:
        raise UsageError(str(e)) from None


def _engine(args: argparse.Namespace) -> int:
    from engine_core.config import config_from_args

    from .checks import UsageError, check_engine

    config = config_from_args(args)
    check_engine(config)
    workers = (
        "; grammar compile workers start after" if config.structured_output.compile_workers else ""
    )
    print(
        f"thinkgate engine: loading the vocabulary ({config.resolved_tokenizer()}) and the model "
        f"({config.model}, device {config.device}){workers}",
        file=sys.stderr,
        flush=True,
    )
    from engine_core.server import run_engine

    try:
        run_engine(config)
    except (OSError, ValueError) as e:
        if config.log_level.upper() == "DEBUG":
            raise
        raise UsageError(f"the engine could not start: {e}") from None
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .checks import UsageError
    from .demo import run

    if args.script is not None and not os.path.isfile(args.script):
        raise UsageError(f"--script {args.script!r}: no such file")
    if args.model is not None and not os.path.isdir(args.model):
        raise UsageError(
            f"--model {args.model!r}: no such directory (thinkgate make-model writes one)"
        )
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens {args.max_tokens}: use 1 or more")
    return run(args)


def _bench(argv: list[str]) -> int:
    from bench.cli import main as bench

    return bench(argv)


def _make_model(argv: list[str]) -> int:
    from .make_model import main as make_model

    return make_model(argv)


#: name -> (help, add its flags, run it)
COMMANDS: dict[
    str,
    tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]],
] = {
    "serve": (
        "the OpenAI-compatible HTTP server (starts an engine, or joins one)",
        _serve_flags,
        _serve,
    ),
    "engine": (
        "the engine-core process alone (clients connect over ZeroMQ)",
        _engine_flags,
        _engine,
    ),
    "demo": ("several chat requests through a spawned engine, printed", _demo_flags, _demo),
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="thinkgate", description=DESCRIPTION, formatter_class=HelpFormatter
    )
    ap.add_argument("--version", action="version", version=f"thinkgate {_version()}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, flags, _) in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=help,
            description=f"thinkgate {name}: {help}.",
            formatter_class=HelpFormatter,
        )
        flags(p)
        _say_defaults(p)
    sub.add_parser(
        "bench",
        help="measure bitmask fill, apply+sample, the engine end to end, the HTTP server",
        add_help=False,
    )
    sub.add_parser("make-model", help="write a small random-weight model directory", add_help=False)
    return ap


def _run(argv: list[str]) -> int:
    from .checks import UsageError

    if argv and argv[0] == "bench":  # it has commands and flags of its own
        return _bench(argv[1:])
    if argv and argv[0] == "make-model":  # its own flags too
        return _make_model(argv[1:])
    ap = parser()
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help()
        return 0
    command = COMMANDS[args.command]
    try:
        return command[2](args)
    except UsageError as e:
        print(f"thinkgate {args.command}: error: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("thinkgate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
