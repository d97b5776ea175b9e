"""The threaded fill (`structured_output.bitmask.SharedFill`): its helper threads run
and fill rows, and every row gets what the row's own fill gives."""

from __future__ import annotations

import json
import os
import random
import threading

import numpy as np
import torch

from bench.states import REQUIRED_SCHEMA
from structured_output import CompileOptions, GrammarSpec, LocalCompiler
from structured_output.bitmask import BitmaskFiller
from structured_output.guide import RequestGuide


def _cpu_ticks(native_id: int) -> int:
    """User plus system clock ticks of one thread of this process (Linux)."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def test_helper_threads_fill_rows_and_every_row_equals_its_own_fill(qwen3):
    lc = LocalCompiler(qwen3, CompileOptions(max_whitespace=16))
    grammar = lc.compile(GrammarSpec.of("json_schema", json.dumps(REQUIRED_SCHEMA)))
    rng = random.Random(5)
    words = (qwen3.vocab_rows + 31) // 32
    one = torch.zeros((1, words), dtype=torch.int32)
    matchers = []
    for _ in range(128):
        m = lc.matcher(grammar)
        for _ in range(rng.randrange(12)):
            m.fill_next_token_bitmask(one)
            bits = np.unpackbits(one[0].numpy().view(np.uint8), bitorder="little")
            ids = np.flatnonzero(bits[: qwen3.vocab_rows]).tolist()
            assert m.accept_token(rng.choice(ids))
        matchers.append(m)
    expected = []
    for m in matchers:
        m.fill_next_token_bitmask(one)
        expected.append(one[0].clone())
    guides = [RequestGuide(None, m) for m in matchers]
    rows = list(range(len(matchers)))
    filler = BitmaskFiller(len(rows), qwen3.vocab_rows, batch_threshold=8, max_threads=2)
    filler.guard = lc.guard
    try:
        filled = filler.fill(rows, guides)
        helpers = [t for t in threading.enumerate() if t.name.startswith("thinkgate-fill-")]
        assert helpers, "the threaded fill started no helper thread"
        ticks = sum(_cpu_ticks(t.native_id) for t in helpers)
        for _ in range(40):
            filled = filler.fill(rows, guides)
        # the helpers took chunks: their own CPU time grew (1 tick = 10 ms; 40 fills of
        # 128 rows take about a CPU-second in all)
        assert sum(_cpu_ticks(t.native_id) for t in helpers) > ticks, os.cpu_count()
        for r in rows:
            assert torch.equal(filled.buffer[r], expected[r]), r
    finally:
        filler.close()
