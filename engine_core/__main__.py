"""``python -m engine_core``: run the engine-core process.

The flags are parsed before anything heavy loads (``--help`` answers at once). Once
the engine has run, the process exits at once (``os._exit``, after flushing its
logs): the interpreter would otherwise spend seconds freeing the model, the
vocabularies and the grammars, past a container's stop timeout.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .config import add_engine_arguments, config_from_args


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and run the engine; once it has run, the process exits with
    its code (0, or 2 when it could not start), and this never returns."""
    parser = argparse.ArgumentParser(
        prog="python -m engine_core",
        description="Run the engine-core process: it serves requests from front ends over "
        "ZeroMQ until SIGTERM, SIGINT or a client's shutdown message.",
    )
    add_engine_arguments(parser)
    config = config_from_args(parser.parse_args(argv))
    from .server import run_engine

    # This process never uses xgrammar's Hugging Face helpers: xgrammar without
    # transformers (about 1.2 CPU-s of every start). Only in the engine's own process:
    # elsewhere xgrammar is imported whole.
    code = run_engine(config, prog=parser.prog, lean_xgrammar=True)
    _deliver_queued(timeout_s=2.0)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _deliver_queued(timeout_s: float) -> None:
    """Let ZeroMQ send what its closed sockets still hold (up to their linger): the
    final outputs of a stopped engine reach their clients although the process skips
    the interpreter's clean-up. Bounded, should a socket be left open."""
    import threading

    import zmq

    t = threading.Thread(target=zmq.Context.instance().term, name="zmq-term", daemon=True)
    t.start()
    t.join(timeout_s)


if __name__ == "__main__":
    main()
