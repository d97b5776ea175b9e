"""CURVE keys: an engine reachable from the network talks only to front ends holding a
key it knows, and every byte between them is encrypted.

A key directory (``--curve-keys DIR``, mode 0700) holds:

- ``engine.key`` / ``engine.key_secret``: the engine's key pair. A front end needs
  ``engine.key`` (public) to know it talks to this engine.
- ``clients/*.key``: the public keys of the front ends the engine accepts.
- ``client.key`` / ``client.key_secret``: a front end's key pair, made with the
  directory (its public half is in ``clients/``). A front end needs
  ``client.key_secret``.

`ensure_keys` makes what is missing. A front end on another machine gets a directory
of its own holding ``engine.key`` and its ``client.key_secret`` (copied over a channel
you trust), and connects with `load_client_keys` of that directory.

The engine's other secret, the token a SHUTDOWN must carry, is read from its
``--shutdown-token-file`` with `read_shutdown_token`.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth


class CurveKeyError(ValueError):
    """A key directory that cannot be used; the message says what to fix."""


ENGINE = "engine"
CLIENT = "client"


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    #: directory of the ``*.key`` public keys of accepted clients
    clients: Path


@dataclass(frozen=True)
class ClientKeys:
    #: the engine's public key
    server_public: bytes
    public: bytes
    secret: bytes


def curve_available() -> bool:
    return bool(zmq.has("curve"))


def _private_dir(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise CurveKeyError(
            f"key directory {str(path)!r} is open to other users (mode {mode:o}): chmod 700 {path}"
        )


def ensure_keys(directory: str | os.PathLike[str]) -> ServerKeys:
    """The engine's keys in ``directory``, made there first if missing (with one client
    key pair)."""
    if not curve_available():
        raise CurveKeyError("this ZeroMQ build has no CURVE support (zmq.has('curve') is False)")
    d = Path(directory)
    if not d.exists():
        d.mkdir(mode=0o700, parents=True)
    _private_dir(d)
    clients = d / "clients"
    if not (d / f"{ENGINE}.key_secret").exists():
        zmq.auth.create_certificates(d, ENGINE)
    if not clients.exists():
        if not (d / f"{CLIENT}.key_secret").exists():
            zmq.auth.create_certificates(d, CLIENT)
        clients.mkdir(mode=0o700)
        shutil.copy(d / f"{CLIENT}.key", clients / f"{CLIENT}.key")
    for f in d.glob("*.key_secret"):
        os.chmod(f, 0o600)
    return load_server_keys(d)


def _load(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise CurveKeyError(f"no key file {str(path)!r}")
    try:
        public, sec = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as e:
        raise CurveKeyError(f"key file {str(path)!r} cannot be read: {e}") from None
    if secret and not sec:
        raise CurveKeyError(f"key file {str(path)!r} holds no secret key")
    return public, sec


def load_server_keys(directory: str | os.PathLike[str]) -> ServerKeys:
    d = Path(directory)
    _private_dir(d)
    public, secret = _load(d / f"{ENGINE}.key_secret", secret=True)
    assert secret is not None
    clients = d / "clients"
    if not clients.is_dir() or not any(clients.glob("*.key")):
        raise CurveKeyError(
            f"no client public keys in {str(clients)!r}: no front end could connect"
        )
    return ServerKeys(public, secret, clients)


def load_client_keys(directory: str | os.PathLike[str]) -> ClientKeys:
    """A front end's keys: ``engine.key`` and ``client.key_secret`` of ``directory``."""
    if not curve_available():
        raise CurveKeyError("this ZeroMQ build has no CURVE support (zmq.has('curve') is False)")
    d = Path(directory)
    server_public, _ = _load(d / f"{ENGINE}.key", secret=False)
    public, secret = _load(d / f"{CLIENT}.key_secret", secret=True)
    assert secret is not None
    return ClientKeys(server_public, public, secret)


def serve_curve(sock: zmq.Socket, keys: ServerKeys) -> zmq.auth.thread.ThreadAuthenticator:
    """Make ``sock`` a CURVE server that admits only the clients of ``keys``; returns
    the running authenticator (stop it after closing the socket). Call before bind."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(sock.context)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.clients))
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    return auth


def connect_curve(sock: zmq.Socket, keys: ClientKeys) -> None:
    """Make ``sock`` a CURVE client of the engine of ``keys``. Call before connect."""
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret


class TokenFileError(ValueError):
    """A --shutdown-token-file that cannot be used."""


def read_shutdown_token(path: str | None) -> str | None:
    """The shutdown token in file ``path`` (None: no file, no token)."""
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise TokenFileError(f"cannot read --shutdown-token-file {path!r}: {e.strerror}") from None
    if not token:
        raise TokenFileError(f"--shutdown-token-file {path!r} is empty")
    return token
