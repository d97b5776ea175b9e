"""``thinkgate bench sample`` at a tiny size: it runs, checks every method's tokens
against each row's top-k / top-p, and writes its records (no timing asserted)."""

from __future__ import annotations

import json

from bench.cli import main
from bench.names import MIXES


def test_sample_bench(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["sample", "--batch-sizes", "5", "--iters", "1", "--warmup", "0", "--json", str(out)]
    assert main(args) == 0
    records = json.loads(out.read_text())
    assert {(r["extra"]["logits"], r["extra"]["mix"], r["method"]) for r in records} == {
        (k, m, meth) for k in ("normal", "peaked") for m in MIXES for meth in ("engine", "baseline")
    }
    assert all(r["vocab_rows"] == 151936 and r["batch_size"] == 5 for r in records)
    assert "engine / plain" in capsys.readouterr().out
