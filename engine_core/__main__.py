"""``python -m engine_core``: run the engine-core process."""

from __future__ import annotations

import argparse

from .config import add_engine_arguments, config_from_args
from .server import run_engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine_core", description=__doc__)
    add_engine_arguments(parser)
    run_engine(config_from_args(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
