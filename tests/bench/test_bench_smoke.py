"""Each bench at the smallest size that still checks the shape of its output, so that
they don't rot: they run, check their own results (the masks agree, sampled tokens are
allowed), and write their JSON and plot. No timing is asserted here; the speed goals
live in the benchmarks themselves."""

from __future__ import annotations

import json

import pytest

from bench import states, summary
from bench.cli import main

REQUIRED = {"bench", "device", "vocab_rows", "batch_size", "method", "median_us", "p90_us"}
SMALL = ["--vocabs", "qwen3", "--batch-sizes", "1,8", "--iters", "2", "--warmup", "1"]


def _records(path) -> list[dict]:
    records = json.loads(path.read_text())
    assert records and all(REQUIRED <= r.keys() for r in records)
    return records


METHODS = {
    "fill": ("engine", "baseline", "loop", "bound_off", "unguarded", "unkept"),
    "apply": ("engine", "baseline"),
}


@pytest.mark.parametrize("bench", ["fill", "apply"])
def test_pair_bench(bench, tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main([bench, *SMALL, "--json", str(out), "--plot", str(png)]) == 0
    records = _records(out)
    assert {(r["batch_size"], r["method"]) for r in records} == {
        (b, m) for b in (1, 8) for m in METHODS[bench]
    }
    assert all(r["vocab_rows"] == 151936 for r in records)
    assert png.stat().st_size > 0
    assert ("b/e" if bench == "fill" else "b/a") in capsys.readouterr().out
    assert summary.main([str(out)]) == 0
    assert "baseline / engine" in capsys.readouterr().out


def test_fill_walks_rows_through_their_documents(tmp_path):
    """``--walk``: each timed step follows one more token of every row's document (a
    row whose document is written starts it again), and the masks still agree after
    (the bench checks them, and raises where they differ)."""
    rows = states.make_rows("qwen3", 4, 0, peer=True, unbounded=True)
    start = [r.position for r in rows]
    for _ in range(3):
        states.advance(rows)
    for r, s in zip(rows, start, strict=True):
        left = len(r.document) - s
        assert r.position == (s + 3 if left >= 3 else len(r.prefix) + (3 - left - 1))
        assert r.matcher.guard_state >= 0
    r = min(rows, key=lambda r: len(r.document) - r.position)  # the end, then again
    for _ in range(len(r.document) - r.position + 2):
        states.advance([r])
    assert r.position == len(r.prefix) + 1
    assert r.next_token == r.document[len(r.prefix) + 1]
    out = tmp_path / "r.json"
    assert main(["fill", *SMALL, "--walk", "--json", str(out)]) == 0
    assert all(r["extra"]["walk"] for r in _records(out) if r["method"] == "engine")


def test_e2e(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = [
        "e2e",
        "--batch-sizes",
        "8",
        "--iters",
        "4",
        "--warmup",
        "2",
        "--constrained",
        "0,1",
        "--grammars",
        "one_tool_schema",
        "--forward-ms",
        "5",
        "--compile-workers",
        "0",
        "--json",
        str(out),
        "--plot",
        str(png),
    ]
    assert main(args) == 0
    records = _records(out)
    assert [
        (r["extra"]["constrained_fraction"], r["extra"]["thinking_fraction"]) for r in records
    ] == [(0.0, 0.0), (1.0, 0.0), (0.0, 0.5), (1.0, 0.5)]
    assert all(r["iters"] >= 4 for r in records)
    assert png.stat().st_size > 0
    assert summary.main([str(out)]) == 0


def test_cuda_skips_cleanly_without_cuda(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the CUDA paths run instead of skipping")
    for bench in ("fill", "apply", "e2e", "latency"):
        assert main([bench, "--device", "cuda"]) == 0
        assert "skipped" in capsys.readouterr().out
    assert main(["throughput", "--device", "cuda", "--model", "unused"]) == 0
    assert "skipped" in capsys.readouterr().out


def test_latency(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = [
        "latency",
        "--requests",
        "10",
        "--warmup",
        "2",
        "--batch-sizes",
        "1,4",
        "--seconds",
        "0.2",
        "--compile-workers",
        "0",
        "--json",
        str(out),
        "--plot",
        str(png),
    ]
    assert main(args) == 0
    records = _records(out)
    assert [(r["extra"]["what"], r["batch_size"]) for r in records] == [
        ("round_trip_1_token", 1),
        ("steps", 1),
        ("steps", 4),
    ]
    assert all(r["median_us"] > 0 for r in records)
    assert records[0]["iters"] == 10
    assert png.stat().st_size > 0
    capsys.readouterr()
    assert summary.main([str(out)]) == 0
    assert "1-token round trip" in capsys.readouterr().out


def test_http(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = ["http", "--requests", "6", "--warmup", "2", "--concurrency", "1,4"]
    args += ["--compile-workers", "0"]
    assert main([*args, "--stream-tokens", "8", "--json", str(out), "--plot", str(png)]) == 0
    records = _records(out)
    assert [(r["method"], r["batch_size"]) for r in records] == [
        ("chat_1_token", 1),
        ("chat_1_token", 4),
        ("stream_8_tokens", 1),
        ("stream_8_tokens", 4),
    ]
    for r in records:
        assert r["iters"] == 6 and r["extra"]["requests_per_s"] > 0
        assert 0 < r["median_us"] <= r["extra"]["p99_us"]
    assert png.stat().st_size > 0


def test_startup(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["startup", "--iters", "1", "--compile-workers", "0", "--json", str(out)]) == 0
    records = _records(out)
    what = [r["method"] for r in records]
    assert what[:3] == ["handshake", "first plain request done", "first JSON request done"]
    cpu = [r["extra"]["cpu_s"] for r in records[:3]]  # the engine's process tree, by then
    assert 0 < cpu[0] <= cpu[1] <= cpu[2]
    assert any(w.startswith("phase: compile worker") for w in what)
    assert all(r["median_us"] > 0 for r in records)
    assert "handshake" in capsys.readouterr().out
    assert summary.main([str(out)]) == 0


def test_jump(tmp_path):
    out = tmp_path / "jump.json"
    args = ["jump", "--model", "scripted", "--calls", "1", "--compile-workers", "0"]
    assert main([*args, "--json", str(out)]) == 0
    records = _records(out)
    got = {(r["grammars"][0], r["method"]): r["extra"] for r in records}
    cases = {
        f"{fam}_{choice}" for fam in ("hermes", "qwen3_coder") for choice in ("named", "required")
    }
    assert set(got) == {(c, m) for c in cases for m in ("sampled", "jump_forward")}
    for case in cases:
        off, on = got[(case, "sampled")], got[(case, "jump_forward")]
        assert on["tokens"] == off["tokens"]  # the scripted calls are the same text
        assert off["ended"] == on["ended"] == 1.0
        assert on["median_passes"] < off["median_passes"], case


def test_drafts(tmp_path):
    out = tmp_path / "drafts.json"
    args = ["drafts", "--model", "scripted", "--batch", "1", "--rounds", "1", "--warmup", "0"]
    args += ["--compile-workers", "0"]
    assert main([*args, "--max-tokens", "48", "--json", str(out)]) == 0
    got = {(r["grammars"][0], r["extra"]["draft_tokens"]): r["extra"] for r in _records(out)}
    assert set(got) == {(w, k) for w in ("copy", "nomatch") for k in (0, 4)}
    off, on = got["copy", 0], got["copy", 4]
    assert on["tokens_per_request"] == off["tokens_per_request"]  # the same answers
    assert on["passes"] < off["passes"] and on["acceptance"] > 0.5
    assert (got["nomatch", 4]["acceptance"] or 0.0) < 0.2  # None: nothing was proposed


def test_strings(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["strings", "--docs", "3", "--json", str(out)]) == 0
    records = _records(out)
    assert [r["method"] for r in records] == list(states.GRAMMARS)
    for r in records:
        x = r["extra"]
        assert x["steps"] >= x["in_string_steps"] >= x["repeats"]
        # equal parser states inside one string gave equal masks, every time
        assert x["repeats_with_equal_masks"] == x["repeats"]
    assert sum(r["extra"]["repeats"] for r in records) > 0
    assert "equal masks" in capsys.readouterr().out


def test_escapes(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["escapes", "--iters", "1", "--warmup", "0", "--json", str(out)]) == 0
    records = _records(out)
    got = {(r["extra"]["document"], r["grammars"][0], r["method"]) for r in records}
    docs = {"program", "windows_paths", "escaped_cjk"}
    kinds = {"json_schema", "json_object"}
    methods = {"engine", "no_memo", "baseline"}
    assert got == {(d, k, m) for d in docs for k in kinds for m in methods}
    for r in records:
        assert r["median_us"] > 0 and r["extra"]["tokens"] > 20
        assert (r["ratio"] is None) == (r["method"] != "engine")  # baseline / engine
    assert "no memo" in capsys.readouterr().out
