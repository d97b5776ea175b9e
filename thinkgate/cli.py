"""The ``thinkgate`` command: ``demo``, ``serve``, ``bench`` and ``make-model``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="thinkgate",
        description="Engine core for structured outputs and forced tool calls "
        "with reasoning models.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "demo", help="run several chat requests through a spawned engine", add_help=False
    )
    sub.add_parser("serve", help="run the engine-core process", add_help=False)
    sub.add_parser("bench", help="measure bitmask fill, apply+sample, end to end", add_help=False)
    sub.add_parser("make-model", help="write a small random-weight model directory", add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from engine_core.__main__ import main as serve

        serve(rest)
        return 0
    if command == "demo":
        from .demo import main as demo

        return demo(rest)
    if command == "bench":
        from bench.cli import main as bench

        return bench(rest)
    if command == "make-model":
        from .make_model import main as make_model

        return make_model(rest)
    parser.parse_args(argv)  # reports the unknown command
    return 2


if __name__ == "__main__":
    sys.exit(main())
