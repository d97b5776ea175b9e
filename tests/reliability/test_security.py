"""Security: nothing from the wire or a request is ever run as code (an AST scan of
every module of the package, and a pickle bomb sent to a live engine); ipc:// sockets
live in a 0700 directory and are 0600 themselves; TCP binds to loopback unless
``--allow-remote`` (with CURVE keys: test_authority.py); tool-call arguments are parsed
as data."""

from __future__ import annotations

import ast
import os
import pickle
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipc import AddressError, ErrorNotice, MsgType, check_bind_address, free_tcp_port
from tests.support.engine import ServedEngine
from tests.support.processes import ROOT
from tests.test_layout import OURS

from .support import RawPeer

#: every package of the project, as the layout test lists them
PACKAGES = sorted(OURS)
#: modules whose import alone is the problem: they (un)pickle, or run code from data
BANNED_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "cloudpickle",
    "dill",
    "marshal",
    "shelve",
    "multiprocessing",
    "copyreg",
    "jsonpickle",
}
BANNED_BUILTINS = {"eval", "exec", "compile", "__import__", "execfile"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for an attribute chain (or a name), else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_const(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def scan_source(source: str, path: str = "<string>") -> list[Finding]:
    """What in ``source`` could run code that came as data."""
    found: list[Finding] = []
    tree = ast.parse(source, filename=path)
    aliases: dict[str, str] = {}  # local name -> dotted module/object it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
                if a.name.split(".")[0] in BANNED_MODULES:
                    found.append(Finding(path, node.lineno, f"import {a.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                if root in BANNED_MODULES:
                    found.append(Finding(path, node.lineno, f"from {node.module} import {a.name}"))
                if a.name == "ProcessPoolExecutor":
                    found.append(
                        Finding(path, node.lineno, "ProcessPoolExecutor (pickles its work)")
                    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "ProcessPoolExecutor":
            found.append(Finding(path, node.lineno, "ProcessPoolExecutor (pickles its work)"))
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in BANNED_BUILTINS and func.id not in aliases:
            found.append(Finding(path, node.lineno, f"{func.id}()"))
            continue
        name = _dotted(func)
        head, _, rest = name.partition(".")
        full = f"{aliases.get(head, head)}.{rest}" if rest else aliases.get(head, head)
        shell = _kw(node, "shell")
        if shell is not None and not _is_const(shell, False):
            found.append(Finding(path, node.lineno, f"{full}(shell=...)"))
        if (
            full in ("os.system", "os.popen")
            or full.startswith("os.exec")
            or full.startswith("os.spawn")
        ):
            found.append(Finding(path, node.lineno, f"{full}()"))
        if full in ("builtins.eval", "builtins.exec", "builtins.compile"):
            found.append(Finding(path, node.lineno, f"{full}()"))
        if full == "torch.load" and not _is_const(_kw(node, "weights_only"), True):
            found.append(Finding(path, node.lineno, "torch.load without weights_only=True"))
        if (
            full in ("numpy.load", "np.load")
            and not _is_const(_kw(node, "allow_pickle"), False)
            and _kw(node, "allow_pickle") is not None
        ):
            found.append(Finding(path, node.lineno, "numpy.load(allow_pickle=...)"))
        if full in ("yaml.load", "yaml.unsafe_load", "yaml.full_load"):
            found.append(Finding(path, node.lineno, f"{full}()"))
        if full.endswith("read_pickle"):
            found.append(Finding(path, node.lineno, f"{full}()"))
    return found


def package_modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_module_of_the_package_can_run_data_as_code():
    modules = package_modules()
    assert len(modules) > 50, "the scan found too few modules to mean anything"
    for pkg in PACKAGES:
        assert any(p.is_relative_to(ROOT / pkg) for p in modules), f"no module of {pkg} scanned"
    findings = [f for p in modules for f in scan_source(p.read_text(), str(p.relative_to(ROOT)))]
    print(f"\nAST scan: {len(modules)} modules of {', '.join(PACKAGES)}; {len(findings)} findings")
    assert findings == [], "\n".join(map(str, findings))


@pytest.mark.parametrize(
    "snippet, what",
    [
        ("import pickle\npickle.loads(b'')", "import pickle"),
        ("from pickle import loads", "from pickle import loads"),
        ("import marshal", "import marshal"),
        ("import shelve", "import shelve"),
        ("import multiprocessing as mp", "import multiprocessing"),
        ("from multiprocessing.pool import Pool", "from multiprocessing.pool import Pool"),
        (
            "from concurrent.futures import ProcessPoolExecutor",
            "ProcessPoolExecutor (pickles its work)",
        ),
        (
            "import concurrent.futures as cf\ncf.ProcessPoolExecutor()",
            "ProcessPoolExecutor (pickles its work)",
        ),
        ("eval('1')", "eval()"),
        ("exec(code)", "exec()"),
        ("compile(src, 'f', 'exec')", "compile()"),
        ("__import__('os')", "__import__()"),
        ("import builtins\nbuiltins.eval('1')", "builtins.eval()"),
        ("import subprocess\nsubprocess.run(cmd, shell=True)", "subprocess.run(shell=...)"),
        ("import subprocess as sp\nsp.Popen(cmd, shell=flag)", "subprocess.Popen(shell=...)"),
        (
            "from subprocess import check_output\ncheck_output(cmd, shell=1)",
            "subprocess.check_output(shell=...)",
        ),
        ("import os\nos.system('ls')", "os.system()"),
        ("import os\nos.popen('ls')", "os.popen()"),
        ("import torch\ntorch.load(f)", "torch.load without weights_only=True"),
        ("import numpy as np\nnp.load(f, allow_pickle=True)", "numpy.load(allow_pickle=...)"),
        ("import yaml\nyaml.load(s)", "yaml.load()"),
    ],
)
def test_the_scan_catches(snippet, what):
    assert what in [f.what for f in scan_source(snippet)], scan_source(snippet)


@pytest.mark.parametrize(
    "snippet",
    [
        "import re\nre.compile('x')",  # a method named compile is not the builtin
        "model.eval()",
        "import subprocess\nsubprocess.Popen(['ls'], shell=False)",
        "import ast\nast.literal_eval('[1]')",
        "import ast\nast.parse('f(x=1)', mode='eval')",
        "import torch\ntorch.load(f, weights_only=True)",
        "import yaml\nyaml.safe_load(s)",
        "import importlib\nimportlib.util.spec_from_file_location('m', p).loader.exec_module(m)",
    ],
)
def test_the_scan_passes(snippet):
    assert scan_source(snippet) == []


def test_the_pythonic_tool_format_parses_arguments_as_data(llama3, tmp_path):
    """Python-style calls ``[f(x=1)]`` are read with ``ast`` as literals; anything else
    (a name, a call, an expression) is not a value, and nothing is ever run."""
    mod = pytest.importorskip(
        "frontend.tool_formats.pythonic",
        reason="the pythonic tool format is not merged on this branch yet",
    )
    source = Path(mod.__file__).read_text()
    assert "ast" in source and scan_source(source) == []
    from frontend.tool_formats import FunctionTool, create_tool_format

    fmt = create_tool_format("pythonic", llama3)
    tools = [
        FunctionTool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    ]
    marker = tmp_path / "pwned"
    parsed = fmt.parse("[get_weather(city='Paris')]", tools)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')
    ]
    for text in (
        f"[get_weather(city=__import__('os').system('touch {marker}'))]",
        f"[get_weather(city=open('{marker}', 'w').write('x'))]",
        "[get_weather(city=[x for x in ().__class__.__base__.__subclasses__()])]",
        f"[get_weather(city=(lambda: open('{marker}', 'w'))())]",
    ):
        parsed = fmt.parse(text, tools)
        for call in parsed.tool_calls:
            assert "__import__" not in call.arguments and "open(" not in call.arguments
    assert not marker.exists()


# ----- what arrives on the wire is never unpickled ---------------------------------------


class _Bomb:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = ServedEngine(
        ["--model", "random", "--max-num-seqs", "8", "--compile-workers", "0"],
        tmp_path_factory.mktemp("sec") / "engine.log",
    )
    yield e
    e.stop()


def test_pickled_payloads_are_refused_not_loaded(engine, tmp_path):
    marker = tmp_path / "pwned"
    bomb = pickle.dumps(_Bomb(str(marker)))  # runs `touch` only if someone unpickles it
    peer = RawPeer(engine.address)
    try:
        peer.hello()
        for t in (MsgType.HELLO, MsgType.REQUEST, MsgType.ABORT, MsgType.HEALTH):
            peer.send([bytes([t]), bomb])
            reply = peer.recv(30)
            assert isinstance(reply, ErrorNotice) and "malformed" in reply.message, reply
        peer.send([bomb, bomb])
        assert isinstance(peer.recv(30), ErrorNotice)
        assert peer.health(1)[0].nonce == 1
    finally:
        peer.close()
    assert not marker.exists()


# ----- sockets private to the user --------------------------------------------------------


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_ipc_socket_is_0600_in_a_0700_directory(engine):
    path = engine.address.removeprefix("ipc://")
    assert _mode(path) == 0o600, oct(_mode(path))
    assert _mode(Path(path).parent) == 0o700, oct(_mode(Path(path).parent))


def test_an_engine_without_an_address_makes_its_own_private_socket(tmp_path):
    """``thinkgate serve`` with no ``--address``: a fresh 0700 directory, removed on exit."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "thinkgate",
                "serve",
                "--model",
                "random",
                "--max-num-seqs",
                "4",
                "--port",
                "0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
        try:
            address = _wait_for_address(proc, log)
            path = Path(address.removeprefix("ipc://"))
            assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
        finally:
            proc.terminate()
            proc.wait(30)
    assert proc.returncode == 0
    assert not path.parent.exists()


def _wait_for_address(proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> str:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if "engine ready on " in line:  # the engine's own log line, through serve
                return line.split("engine ready on ", 1)[1].split()[0]
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError("the engine did not start")


@pytest.mark.parametrize(
    "address",
    [
        "tcp://0.0.0.0:5555",
        "tcp://*:5555",
        "tcp://[::]:5555",
        "tcp://192.168.1.10:5555",
        "tcp://eth0:5555",
        "tcp://example.com:5555",
    ],
)
def test_check_bind_address_refuses_what_is_not_loopback(address):
    with pytest.raises(AddressError, match="loopback.*--allow-remote"):
        check_bind_address(address)
    with pytest.raises(AddressError, match="without authentication.*--curve-keys"):
        check_bind_address(address, allow_remote=True)
    check_bind_address(address, allow_remote=True, authenticated=True)


@pytest.mark.parametrize(
    "address",
    ["tcp://127.0.0.1:5555", "tcp://127.0.0.2:5555", "tcp://localhost:5555", "tcp://[::1]:5555"],
)
def test_check_bind_address_allows_loopback(address):
    check_bind_address(address)


def test_check_bind_address_refuses_a_directory_others_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(AddressError, match="writable by other users"):
        check_bind_address(f"ipc://{shared}/engine.sock")
    with pytest.raises(AddressError, match="does not exist"):
        check_bind_address(f"ipc://{tmp_path}/missing/engine.sock")
    with pytest.raises(AddressError, match="unsupported address"):
        check_bind_address("udp://127.0.0.1:1")


@pytest.mark.parametrize("command", [["-m", "engine_core"], ["-m", "thinkgate", "serve"]])
def test_a_public_tcp_address_refuses_to_start_with_a_clear_message(command):
    port = free_tcp_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, *command, "--model", "random", "--address", f"tcp://0.0.0.0:{port}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode != 0
    assert (
        f"refusing to bind tcp://0.0.0.0:{port}: TCP binds to a loopback address unless "
        "--allow-remote is given" in res.stderr
    ), res.stderr[-2000:]
