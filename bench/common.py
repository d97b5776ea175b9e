"""What every bench shares: devices, timing, records, the table and the plot.

Timing: the methods of one measurement run side by side, in alternating order, on the
same inputs; warm-up iterations are dropped; results are medians and 90th percentiles
in microseconds. On CUDA a timed call is bracketed by CUDA events after a
``torch.cuda.synchronize()``, and the end event is waited for.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

# ----- devices -------------------------------------------------------------------


def cuda_missing(device: str) -> str | None:
    """Why ``device`` cannot run here, or None when it can."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        why = f"CUDA is not available on this machine (torch {torch.__version__})"
        return f"--device {device}: {why}; skipped"
    return None


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return f"cuda ({torch.cuda.get_device_name(torch.device(device))})"
    return f"cpu ({os.cpu_count()} cores)"


# ----- timing --------------------------------------------------------------------


def timer(device: str) -> Callable[[Callable[[], Any]], float]:
    """A function that runs ``fn()`` once and returns its duration in microseconds."""
    if not device.startswith("cuda"):

        def cpu(fn: Callable[[], Any]) -> float:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6

        return cpu

    def cuda(fn: Callable[[], Any]) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3

    return cuda


#: a method: called untimed to get ready (fresh inputs), it returns the call to time
Method = Callable[[], Callable[[], Any]]


def side_by_side(
    methods: dict[str, Method],
    *,
    iters: int,
    warmup: int,
    device: str,
    between: Callable[[], Any] | None = None,
) -> dict[str, np.ndarray]:
    """Time each method ``warmup + iters`` times, in a new order each round (seeded):
    what ran just before a method (whose memory it evicted from the caches, whose
    threads are still winding down) is then any of the others alike, not always the
    same neighbour. ``between``, untimed, runs before each round (the next step of a
    decode). Returns the ``iters`` timed durations (µs) of each."""
    clock = timer(device)
    names = list(methods)
    out: dict[str, list[float]] = {n: [] for n in names}
    order = random.Random(len(names) * 1000 + iters)
    for i in range(warmup + iters):
        if between is not None:
            between()
        order.shuffle(names)
        for name in names:
            call = methods[name]()
            t = clock(call)
            if i >= warmup:
                out[name].append(t)
    return {n: np.asarray(v) for n, v in out.items()}


def p50(x: np.ndarray) -> float:
    return float(np.median(x))


def p90(x: np.ndarray) -> float:
    return float(np.percentile(x, 90))


def helper_start_us(samples: int = 100, busy_bytes: int = 1 << 20) -> float:
    """Median delay from handing a waiting thread a job to its starting it, while the
    handing thread goes on working without the GIL, as a threaded fill does (SHA-256
    of ``busy_bytes``, a few hundred µs). Every fill on helper threads pays it before a
    helper takes its first chunk, and once more when the filling thread must wait for
    a helper's last one. A few µs where an idle CPU wakes at once; far more on virtual
    machines whose idle vCPUs halt or whose scheduler packs threads onto one vCPU,
    which is what caps the gain of threads at mid-size batches there."""
    import hashlib
    import queue
    import threading

    jobs: queue.SimpleQueue[float | None] = queue.SimpleQueue()
    starts: queue.SimpleQueue[float] = queue.SimpleQueue()

    def helper() -> None:
        while (sent := jobs.get()) is not None:
            starts.put(time.perf_counter() - sent)

    thread = threading.Thread(target=helper, name="bench-helper-start", daemon=True)
    thread.start()
    data = bytes(busy_bytes)
    delays = []
    try:
        for _ in range(samples):
            time.sleep(0.001)  # the helper waits, as between two steps
            jobs.put(time.perf_counter())
            hashlib.sha256(data).digest()  # without the GIL
            delays.append(starts.get())
    finally:
        jobs.put(None)
        thread.join()
    return p50(np.asarray(delays)) * 1e6


def threads_line(extra: dict[str, Any]) -> str:
    """The footer of a fill table: its threads and how late a helper starts."""
    return (
        f"fill threads: {extra.get('fill_threads')}; a waiting helper starts "
        f"{extra.get('helper_start_us')} µs after it is handed a job (median, "
        "bench.common.helper_start_us)"
    )


# ----- records -------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """Versions, machine and load, stored with every record."""

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "absent"

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "xgrammar": version("xgrammar"),
        "numpy": np.__version__,
        "machine": f"{platform.machine()} {cpu}, {os.cpu_count()} cores",
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


@dataclass
class Record:
    """One measurement: one method at one size on one device and vocabulary."""

    bench: str  # fill | apply | e2e
    device: str
    vocab: str
    vocab_rows: int
    batch_size: int
    method: str  # engine | baseline
    median_us: float
    p90_us: float
    per_row_median_us: float
    per_row_p90_us: float
    iters: int
    warmup: int
    seed: int
    grammars: list[str]
    #: baseline median over engine median, on the engine's records (None elsewhere)
    ratio: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)


def pair_records(
    bench: str,
    times: dict[str, np.ndarray],
    *,
    device: str,
    vocab: str,
    vocab_rows: int,
    batch_size: int,
    iters: int,
    warmup: int,
    seed: int,
    grammars: Sequence[str],
    env: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> list[Record]:
    """The engine's and the baseline's records of one side-by-side measurement."""
    extra = {**(extra or {}), "loadavg_1m": round(os.getloadavg()[0], 2)}
    recs = []
    for method, t in times.items():
        recs.append(
            Record(
                bench=bench,
                device=device,
                vocab=vocab,
                vocab_rows=vocab_rows,
                batch_size=batch_size,
                method=method,
                median_us=round(p50(t), 1),
                p90_us=round(p90(t), 1),
                per_row_median_us=round(p50(t) / batch_size, 2),
                per_row_p90_us=round(p90(t) / batch_size, 2),
                iters=iters,
                warmup=warmup,
                seed=seed,
                grammars=list(grammars),
                ratio=round(p50(times["baseline"]) / p50(t), 2) if method == "engine" else None,
                extra=extra,
                env=env,
            )
        )
    return recs


def write_json(path: str | os.PathLike[str], records: Sequence[Record]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps([asdict(r) for r in records], indent=1, ensure_ascii=False) + "\n")


# ----- table and plot ------------------------------------------------------------------


def pair_table(records: Sequence[Record]) -> str:
    """Engine against baseline, one line per (vocabulary, batch size)."""
    by: dict[tuple[str, int], dict[str, Record]] = {}
    for r in records:
        by.setdefault((r.vocab, r.batch_size), {})[r.method] = r
    head = (
        f"{'vocab':<14}{'batch':>6}  {'engine p50':>11}{'p90':>10}{'/row':>9}"
        f"  {'baseline p50':>13}{'p90':>10}{'/row':>9}  {'b/a':>6}"
    )
    lines = [head, "-" * len(head)]
    for (vocab, b), m in by.items():
        e, base = m.get("engine"), m.get("baseline")
        if e is None or base is None:
            continue
        lines.append(
            f"{vocab:<14}{b:>6}  {_us(e.median_us):>11}{_us(e.p90_us):>10}"
            f"{_us(e.per_row_median_us):>9}"
            f"  {_us(base.median_us):>13}{_us(base.p90_us):>10}{_us(base.per_row_median_us):>9}"
            f"  {e.ratio:>5.2f}x"
        )
    return "\n".join(lines)


def _us(x: float) -> str:
    """Microseconds, with a unit that keeps the figure short."""
    if x >= 1e5:
        return f"{x / 1e3:.0f} ms"
    if x >= 1e3:
        return f"{x / 1e3:.2f} ms"
    return f"{x:.1f} µs"


def pair_plot(records: Sequence[Record], path: str | os.PathLike[str], title: str) -> None:
    """Per-step median (log scale) against batch size, and the ratio, per vocabulary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axr) = plt.subplots(1, 2, figsize=(11, 4.2))
    vocabs = list(dict.fromkeys(r.vocab for r in records))
    for vi, vocab in enumerate(vocabs):
        for method, style in (("engine", "-o"), ("baseline", "--s")):
            rs = sorted(
                (r for r in records if r.vocab == vocab and r.method == method),
                key=lambda r: r.batch_size,
            )
            if rs:
                ax.plot(
                    [r.batch_size for r in rs],
                    [r.median_us / 1e3 for r in rs],
                    style,
                    color=f"C{vi}",
                    label=f"{method}, {vocab}",
                )
        es = sorted(
            (r for r in records if r.vocab == vocab and r.method == "engine"),
            key=lambda r: r.batch_size,
        )
        axr.plot(
            [r.batch_size for r in es], [r.ratio for r in es], "-o", color=f"C{vi}", label=vocab
        )
    sizes = sorted({r.batch_size for r in records})
    for a in (ax, axr):
        a.set_xscale("log", base=2)
        a.set_xticks(sizes, [str(s) for s in sizes])
        a.set_xlabel("batch size (rows)")
        a.grid(True, which="both", alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("median per step (ms)")
    ax.legend(fontsize=8)
    axr.axhline(1.0, color="gray", lw=1)
    axr.set_ylabel("baseline / engine (higher: engine faster)")
    axr.legend(fontsize=8)
    dev = records[0].device if records else ""
    fig.suptitle(f"{title} — {dev}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
