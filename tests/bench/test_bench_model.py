"""The benches that run a model directory (``e2e --model``, ``throughput``), at tiny
sizes on a tiny model, so that they don't rot: they run every method and mix, check
the work each did, and write their JSON and plot. No timing is asserted here.

Each loads the model in this process and starts engines beside it (half a minute on
two cores): they run with ``-m slow``, as the benches themselves do, by hand."""

from __future__ import annotations

import json

import pytest

from bench import summary
from bench.cli import main
from tests.support.tiny_model import build_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("bench") / "m", hidden=16)


def test_e2e_with_a_model(model, tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = ["e2e", "--model", str(model), "--batch-sizes", "2", "--iters", "3"]
    args += ["--warmup", "2", "--constrained", "0,1", "--thinking", "0", "--max-tokens", "64"]
    args += ["--compile-workers", "0"]
    assert main([*args, "--json", str(out), "--plot", str(png)]) == 0
    records = json.loads(out.read_text())
    assert [
        (r["extra"]["constrained_fraction"], r["extra"]["thinking_fraction"]) for r in records
    ] == [(0.0, 0.0), (1.0, 0.0)]
    for r in records:
        x = r["extra"]
        assert r["iters"] >= 3 and x["tokens_per_s"] > 0 and x["model"] == str(model)
        assert 0 <= x["so_share"] < 1
        if x["constrained_fraction"]:
            assert x["mean_masked_rows"] > 0 and x["fill_hidden"] is not None
    assert png.stat().st_size > 0
    assert summary.main([str(out)]) == 0


def test_throughput(model, tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    # batch size 1: the batched and the one-at-a-time runs share one engine process
    args = ["throughput", "--model", str(model), "--requests", "2", "--batch-size", "1"]
    args += ["--new-tokens", "4", "--iters", "1", "--warmup", "0", "--grammars", "hermes_tag"]
    args += ["--compile-workers", "0"]
    assert main([*args, "--json", str(out), "--plot", str(png)]) == 0
    records = json.loads(out.read_text())
    got = {(r["extra"]["mode"], r["method"]): r for r in records}
    assert set(got) == {
        ("unconstrained", m)
        for m in ("engine", "hf_padded", "hf_continuous", "engine_one", "hf_one")
    } | {("constrained", m) for m in ("engine", "hf_padded", "engine_one", "hf_one")}
    for (mode, method), r in got.items():
        n = r["extra"]["requests"] * 4
        if mode == "unconstrained":  # every method wrote exactly the same work
            assert r["extra"]["tokens"] == [n], method
        else:  # a forced call ends at its grammar's end or at the cap
            assert 0 < r["extra"]["tokens"][0] <= n, method
        assert r["extra"]["tokens_per_s"] > 0
    assert "engine x" in capsys.readouterr().out
    assert png.stat().st_size > 0
    assert summary.main([str(out)]) == 0
