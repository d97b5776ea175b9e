"""`bench.summary` over a committed side-by-side run with vLLM (the run itself needs
vLLM's venv, so no test makes one): a row per batch size with the ratios recomputed
from the medians, and the one-row pass summarized from its per-state records."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench import summary

RUN = Path(__file__).parents[2] / "bench/results/2026-12-03-cpu-2core-fill-vs-vllm.json"


def test_the_vllm_table_and_the_one_row_line_come_from_the_records():
    records = json.loads(RUN.read_text())
    table = summary.fill_vs_vllm(records)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    batches = sorted({r["batch_size"] for r in records if "state" not in r["extra"]})
    assert [int(line.split("|")[1]) for line in rows[1:]] == batches
    by = {(r["batch_size"], r["method"]): r for r in records if "state" not in r["extra"]}
    for line, b in zip(rows[1:], batches, strict=True):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        paired = by[b, "engine_paired"]["median_us"]
        assert cells[3] == f"**{by[b, 'engine']['ratio']:.2f}x**"
        assert cells[5] == f"{paired / by[b, 'bound_off']['median_us']:.2f}x"
        assert cells[7] == f"{paired / by[b, 'unguarded']['median_us']:.2f}x"
    ratios = [r["ratio"] for r in records if r["method"] == "engine_state"]
    assert len(ratios) == 32
    line = summary.one_row_line(records)
    assert f"median {statistics.median(ratios):.2f}x" in line
    assert f"lowest {min(ratios):.2f}x" in line
    assert f"slower at {sum(x < 1 for x in ratios)} of 32" in line
    assert summary.one_row_line([r for r in records if "state" not in r["extra"]]) == ""


ESCAPES = Path(__file__).parents[2] / "bench/results/2026-12-03b-cpu-2core-escapes.json"


def test_the_escapes_table_has_a_row_per_document_and_grammar():
    records = json.loads(ESCAPES.read_text())
    table = summary.escapes(records)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    cases = {(r["extra"]["document"], r["grammars"][0]) for r in records}
    assert len(rows) - 1 == len(cases) == 6
    by = {(r["extra"]["document"], r["grammars"][0], r["method"]): r for r in records}
    for line in rows[1:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        engine = by[cells[0], cells[1], "engine"]
        memo = by[cells[0], cells[1], "no_memo"]["median_us"] / engine["median_us"]
        assert cells[5] == f"{memo:.2f}x"
        assert cells[7] == f"**{engine['ratio']:.2f}x**"
