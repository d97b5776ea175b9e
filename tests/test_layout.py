"""The layout's rule: each folder imports only the folders below it in the table of
DESIGN.md (the generic registry, tokenizers and the wire at the bottom), never one
above."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.processes import PACKAGES, ROOT

OURS = {*PACKAGES, "bench"}
#: importable by every package: it imports nothing of ours
BOTTOM = {"registry"}
ALLOWED = {
    "registry": set(),
    "tokenization": BOTTOM,
    "ipc": BOTTOM,
    "reasoning": BOTTOM | {"tokenization"},
    "structured_output": BOTTOM | {"tokenization", "reasoning"},
    "engine_core": BOTTOM | {"tokenization", "ipc", "reasoning", "structured_output"},
    "frontend": BOTTOM | {"tokenization", "ipc", "reasoning", "structured_output", "engine_core"},
    "thinkgate": OURS - {"thinkgate"},
    "bench": OURS - {"bench"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(OURS))
def test_imports_point_one_way(package):
    bad = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        wrong = _imports(path) - ALLOWED[package] - {package}
        if wrong:
            bad[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not bad, f"imports against the layout: {bad}"
