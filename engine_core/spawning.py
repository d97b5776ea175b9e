"""Starting an engine process for a client: its address, a private directory, the
shutdown token only the spawning client holds, and its CURVE keys."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ipc import ClientKeys, ensure_keys, load_client_keys, private_ipc_address

from .config import EngineConfig

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass
class Spawned:
    address: str
    proc: subprocess.Popen
    #: a private (0700) directory: the ipc:// socket, the token file; the client
    #: removes it when it is done
    own_dir: Path
    #: what a SHUTDOWN must carry to stop this engine
    shutdown_token: str
    curve: ClientKeys | None


def start_engine(config: EngineConfig) -> Spawned:
    """``python -m engine_core`` with ``config`` (on a private ipc:// socket unless the
    config names an address), a shutdown token of its own (unless the config names a
    token file), exiting when this process does."""
    if config.address is None:
        address, own_dir = private_ipc_address()
    else:
        address = config.address
        own_dir = Path(tempfile.mkdtemp(prefix="thinkgate-"))
        os.chmod(own_dir, 0o700)
    args = list(config.to_args())
    if config.address is None:
        args += ["--address", address]
    if config.shutdown_token_file is None:
        token = secrets.token_urlsafe(32)
        token_file = own_dir / "shutdown.token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        args += ["--shutdown-token-file", str(token_file)]
    else:
        token = Path(config.shutdown_token_file).read_text().strip()
    curve = None
    if config.curve_keys:
        ensure_keys(config.curve_keys)  # made here, so that both sides read the same
        curve = load_client_keys(config.curve_keys)
    args += ["--parent-pid", str(os.getpid())]
    env = dict(os.environ)
    env["PYTHONPATH"] = _PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine_core", *args], env=env, stdout=subprocess.DEVNULL
    )
    return Spawned(address, proc, own_dir, token, curve)
