"""The engine process with timers around the phases of its step (for ``bench e2e``).

``python -m bench.engine_probe --probe-out PATH [engine flags]`` runs the ordinary
engine server (`engine_core.server.run_engine`); the only difference is a subclass of
`EngineCore` that notes, per step: its wall time, the time of ``_prepare`` (feeding
last step's tokens to the guides and filling the masks, while the forward pass runs on
the model thread), the forward pass itself (on the model thread), the time blocked
waiting for it, the part of ``_prepare`` that outlasted the forward pass, the time of
``Sampler.sample`` and, within it, of the mask work (allowed ids from the masks,
masks applied), and the batch's make-up (rows, rows sampled, masked rows, thinking
rows). It writes them as JSON columns to PATH when the engine stops
(SIGTERM). A few ``perf_counter`` calls per step are all it adds. ``--torch-threads``
sets the engine's torch intra-op threads.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from engine_core import sampler as sampler_module
from engine_core import server
from engine_core.config import add_engine_arguments, config_from_args
from engine_core.engine import EngineCore

#: the sampler's mask work (module functions of `engine_core.sampler`, and the
#: sampler's own masking in place, timed whole: it may use a helper thread)
MASK_FUNCTIONS = ("allowed_counts", "allowed_ids")
MASK_WORK = (*MASK_FUNCTIONS, "mask_in_place")
COLUMNS = (
    "t",
    "step",
    "prepare",
    "forward",
    "wait",
    "exposed",
    "sample",
    "apply",
    *(f"apply_{name}" for name in MASK_WORK),
    "rows",
    "ready",
    "masked",
    "thinking",
)


class ProbedCore(EngineCore):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.probe: dict[str, list[float]] = {c: [] for c in COLUMNS}
        self._cur: dict[str, float] = {}
        forward, sample = self.runner.forward, self.sampler.sample

        def timed_forward(rows):
            t0 = time.perf_counter()
            out = forward(rows)
            self._cur["forward"] = time.perf_counter() - t0
            self._cur["forward_end"] = time.perf_counter()
            return out

        def timed_sample(logits, batch, cons):
            t0 = time.perf_counter()
            out = sample(logits, batch, cons)
            self._cur["sample"] = time.perf_counter() - t0
            return out

        self.runner.forward = timed_forward
        self.sampler.sample = timed_sample
        for name in MASK_FUNCTIONS:
            setattr(
                sampler_module, name, self._timed_mask_work(name, getattr(sampler_module, name))
            )
        self.sampler.mask_in_place = self._timed_mask_work(  # type: ignore[method-assign]
            "mask_in_place", self.sampler.mask_in_place
        )

    def _timed_mask_work(self, name, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            took = time.perf_counter() - t0
            self._cur["apply"] = self._cur.get("apply", 0.0) + took
            self._cur[f"apply_{name}"] = self._cur.get(f"apply_{name}", 0.0) + took
            return out

        return timed

    def _prepare(self, batch):
        t0 = time.perf_counter()
        res = super()._prepare(batch)
        t1 = time.perf_counter()
        self._cur["prepare"] = t1 - t0
        self._cur["prepare_end"] = t1
        cons = res[0]
        self._cur["masked"] = len(cons.mask.rows) if cons.mask is not None else 0
        self._cur["thinking"] = sum(1 for r in batch if r.guide is not None and r.guide.thinking)
        self._cur["ready"] = len(batch)
        return res

    def step(self):
        self._cur = {}
        t0 = time.perf_counter()
        out = super().step()
        t1 = time.perf_counter()
        c = self._cur
        if "sample" in c:  # a step that ran the batch
            p = self.probe
            p["t"].append(t0)
            p["step"].append(t1 - t0)
            p["prepare"].append(c["prepare"])
            p["forward"].append(c["forward"])
            p["wait"].append(max(0.0, c["forward_end"] - c["prepare_end"]))
            p["exposed"].append(max(0.0, c["prepare_end"] - c["forward_end"]))
            p["sample"].append(c["sample"])
            p["apply"].append(c.get("apply", 0.0))
            for name in MASK_WORK:
                p[f"apply_{name}"].append(c.get(f"apply_{name}", 0.0))
            p["ready"].append(c["ready"])
            p["rows"].append(c["rows"])
            p["masked"].append(c["masked"])
            p["thinking"].append(c["thinking"])
        return out

    def _schedule(self):
        super()._schedule()
        self._cur["rows"] = len(self.running)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.engine_probe", description=__doc__)
    ap.add_argument("--probe-out", required=True)
    ap.add_argument("--torch-threads", type=int, help="torch intra-op threads of the engine")
    add_engine_arguments(ap)
    ns = ap.parse_args(argv)
    cores: list[ProbedCore] = []
    if ns.torch_threads:
        import torch

        torch.set_num_threads(ns.torch_threads)

    def make(*args, **kwargs):
        core = ProbedCore(*args, **kwargs)
        cores.append(core)
        return core

    server.EngineCore = make  # the server builds its core through this name
    try:
        server.run_engine(config_from_args(ns))
    finally:
        if cores:
            Path(ns.probe_out).write_text(json.dumps(cores[0].probe))


if __name__ == "__main__":
    main()
