"""``python -m engine_core``: run the engine-core process."""

from __future__ import annotations

import argparse
import sys

from ipc import AddressError, CurveKeyError

from .config import add_engine_arguments, config_from_args
from .server import TokenFileError, run_engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine_core", description=__doc__)
    add_engine_arguments(parser)
    config = config_from_args(parser.parse_args(argv))
    try:
        run_engine(config)
    # an address the engine will not bind, keys or a token it cannot use: say so, in
    # one line, no traceback
    except (AddressError, CurveKeyError, TokenFileError) as e:
        sys.exit(f"{parser.prog}: error: {e}")


if __name__ == "__main__":
    main()
