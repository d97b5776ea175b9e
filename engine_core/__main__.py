"""``python -m engine_core``: run the engine-core process."""

from __future__ import annotations

import argparse
import sys

from ipc import AddressError

from .config import add_engine_arguments, config_from_args
from .server import run_engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine_core", description=__doc__)
    add_engine_arguments(parser)
    config = config_from_args(parser.parse_args(argv))
    try:
        run_engine(config)
    except AddressError as e:  # an address the engine will not bind: say so, no traceback
        sys.exit(f"{parser.prog}: error: {e}")


if __name__ == "__main__":
    main()
