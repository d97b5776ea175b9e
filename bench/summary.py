"""Markdown tables of bench JSON files: ``python -m bench.summary FILE.json ...``."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f}" if us < 1e5 else f"{us / 1e3:.0f}"


def pairs(records: list[dict]) -> str:
    """fill / apply: engine against baseline per vocabulary and batch size (fill: and
    the engine against its own per-row loop and with its guard off)."""
    by: dict[tuple[str, int], dict[str, dict]] = {}
    for r in records:
        by.setdefault((r["vocab"], r["batch_size"]), {})[r["method"]] = r
    lines = [
        "| vocab | batch | engine p50 (ms) | engine p90 | per row (µs) "
        "| baseline p50 (ms) | baseline p90 | per row (µs) | baseline / engine |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    extra = "loop" in next(iter(by.values()), {})
    if extra:
        lines[0] += " loop / engine | guard on / off |"
        lines[1] += "---:|---:|"
    for (vocab, b), m in by.items():
        e, base = m["engine"], m["baseline"]
        line = (
            f"| {vocab} | {b} | {_ms(e['median_us'])} | {_ms(e['p90_us'])} "
            f"| {e['per_row_median_us']:.1f} | {_ms(base['median_us'])} | {_ms(base['p90_us'])} "
            f"| {base['per_row_median_us']:.1f} | **{e['ratio']:.2f}x** |"
        )
        if extra:
            line += (
                f" {m['loop']['median_us'] / e['median_us']:.2f}x "
                f"| {e['median_us'] / m['unguarded']['median_us']:.2f}x |"
            )
        lines.append(line)
    return "\n".join(lines)


def e2e(records: list[dict]) -> str:
    lines = [
        "| batch | constrained | thinking | rows | masked | thinking rows | step p50 (ms) | p90 "
        "| prepare | forward | wait | sample | other | tokens/s | SO share | fill hidden "
        "| SO overhead |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        x = r["extra"]
        ph = x["phase_median_us"]
        ov = x["so_overhead"]
        hidden = x.get("fill_hidden")
        lines.append(
            f"| {r['batch_size']} | {x['constrained_fraction']:.0%} | {x['thinking_fraction']:.0%} "
            f"| {x['mean_rows']:.0f} | {x['mean_masked_rows']:.0f} | {x['mean_thinking_rows']:.0f} "
            f"| {_ms(r['median_us'])} | {_ms(r['p90_us'])} "
            + "".join(f"| {_ms(ph[p])} " for p in ("prepare", "forward", "wait", "sample", "other"))
            + (f"| {x['tokens_per_s']:.0f} " if "tokens_per_s" in x else "| - ")
            + (f"| {x['so_share']:.1%} " if "so_share" in x else "| - ")
            + (f"| {hidden:.0%} " if hidden is not None else "| - ")
            + (f"| **{ov:+.1%}** |" if ov is not None else "| - |")
        )
    return "\n".join(lines)


def throughput(records: list[dict]) -> str:
    lines = [
        "| mode | method | batch | tokens/s | run p50 (s) | engine / method |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in records:
        x = r["extra"]
        ratio = f"**{r['ratio']:.2f}x**" if r["ratio"] is not None else "-"
        lines.append(
            f"| {x['mode']} | {r['method']} | {r['batch_size']} | {x['tokens_per_s']:.1f} "
            f"| {r['median_us'] / 1e6:.2f} | {ratio} |"
        )
    return "\n".join(lines)


def latency(records: list[dict]) -> str:
    lines = ["| measurement | batch | p50 (ms) | p90 (ms) | steps/s |", "|---|---:|---:|---:|---:|"]
    for r in records:
        x = r["extra"]
        what = "1-token round trip" if x["what"] == "round_trip_1_token" else "engine step"
        rate = f"{x['steps_per_s']:.1f}" if "steps_per_s" in x else "-"
        lines.append(
            f"| {what} | {r['batch_size']} | {r['median_us'] / 1e3:.2f} "
            f"| {r['p90_us'] / 1e3:.2f} | {rate} |"
        )
    return "\n".join(lines)


def one_row_line(records: list[dict]) -> str:
    """The per-state pass at one row (``*_state`` records, `bench.peer`): the median
    and the lowest of vLLM / engine over the states, and how many states the engine
    loses; "" where there is none."""
    ratios = [(r["ratio"], r["extra"]) for r in records if r["method"] == "engine_state"]
    if not ratios:
        return ""
    ratios.sort(key=lambda x: x[0])
    low, at = ratios[0]
    mid = statistics.median(x for x, _ in ratios)
    slower = sum(1 for x, _ in ratios if x < 1)
    return (
        f"1 row at each of {len(ratios)} states, vLLM / engine: median {mid:.2f}x, lowest "
        f"{low:.2f}x (state {at['state']}, after {at['tail']!r}); the engine slower at "
        f"{slower} of {len(ratios)}"
    )


def fill_vs_vllm(records: list[dict]) -> str:
    """The engine against vLLM's grammar_bitmask, per batch size; what the bound and
    the whole guard cost (the engine's own fillers interleaved step by step)."""
    by: dict[int, dict[str, dict]] = {}
    for r in records:
        if "state" not in r["extra"]:
            by.setdefault(r["batch_size"], {})[r["method"]] = r
    lines = [
        "| batch | vLLM p50 (ms) | engine p50 (ms) | vLLM / engine | bound off (ms) "
        "| bound on / off | guard off (ms) | guard on / off |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b, m in sorted(by.items()):
        v, e, u = m["vllm"], m["engine"], m["unguarded"]
        paired = m.get("engine_paired", e)["median_us"]
        f = m.get("bound_off")  # (files before 2026-12-02 have none)
        bound = f"{_ms(f['median_us'])} | {paired / f['median_us']:.2f}x" if f else "- | -"
        lines.append(
            f"| {b} | {_ms(v['median_us'])} | {_ms(e['median_us'])} | **{e['ratio']:.2f}x** "
            f"| {bound} | {_ms(u['median_us'])} | {paired / u['median_us']:.2f}x |"
        )
    line = one_row_line(records)
    return "\n".join(lines) + (f"\n\n{line}" if line else "")


def escapes(records: list[dict]) -> str:
    """A row per document and grammar: the engine, with nothing remembered nor derived
    mid-escape (``no_memo``), and the baseline, each a whole decode of the document."""
    by: dict[tuple[str, str], dict[str, dict]] = {}
    for r in records:
        by.setdefault((r["extra"]["document"], r["grammars"][0]), {})[r["method"]] = r
    lines = [
        "| document | grammar | tokens | engine (ms) | no memo (ms) | no memo / engine "
        "| baseline (ms) | baseline / engine |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (document, grammar), m in by.items():
        e, n, base = m["engine"], m["no_memo"], m["baseline"]
        lines.append(
            f"| {document} | {grammar} | {e['extra']['tokens']} | {_ms(e['median_us'])} "
            f"| {_ms(n['median_us'])} | {n['median_us'] / e['median_us']:.2f}x "
            f"| {_ms(base['median_us'])} | **{e['ratio']:.2f}x** |"
        )
    return "\n".join(lines)


def startup(records: list[dict]) -> str:
    lines = ["| vocabulary | what | wall (s) | CPU (s) |", "|---|---|---:|---:|"]
    for r in records:
        cpu = r["extra"].get("cpu_s")
        cpu_text = "" if cpu is None else f"{cpu:.2f}"
        lines.append(f"| {r['vocab']} | {r['method']} | {r['median_us'] / 1e6:.2f} | {cpu_text} |")
    return "\n".join(lines)


TABLES = {
    "e2e": e2e,
    "latency": latency,
    "throughput": throughput,
    "fill-vs-vllm": fill_vs_vllm,
    "startup": startup,
    "escapes": escapes,
}


def _loads(records: list[dict]) -> list[float]:
    out: list[float] = []
    for r in records:
        x = r["extra"].get("loadavg_1m", r["env"].get("loadavg_1m"))
        out += x if isinstance(x, list) else [x]
    return out


def main(argv: list[str] | None = None) -> int:
    for path in sys.argv[1:] if argv is None else argv:
        records = json.loads(Path(path).read_text())
        env = records[0]["env"]
        print(f"### {Path(path).name}\n")
        print(
            f"{records[0]['bench']} on {records[0]['device']}, {env['machine']}; torch "
            f"{env['torch']}, xgrammar {env['xgrammar']}; {env['date']}; seed "
            f"{records[0]['seed']}, {records[0]['iters']} iterations after {records[0]['warmup']} "
            f"warm-up; 1-minute load average {min(_loads(records))}-{max(_loads(records))}.\n"
        )
        print(TABLES.get(records[0]["bench"], pairs)(records))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
