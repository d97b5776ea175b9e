"""How many threads share a batched fill, and that many of them fill what one does."""

from __future__ import annotations

import json
import os
import random
import threading

import numpy as np
import pytest
import torch
import xgrammar as xgr

from structured_output import CompileOptions, GrammarSpec, LocalCompiler
from structured_output.bitmask import BitmaskFiller, fill_threads_for, usable_cpus
from structured_output.config import StructuredOutputConfig
from structured_output.guide import RequestGuide


@pytest.mark.parametrize(
    ("cpus", "threads"), [(1, 2), (2, 2), (4, 2), (6, 3), (16, 8), (17, 8), (64, 8)]
)
def test_auto_takes_one_thread_per_two_cpus_from_2_to_8(cpus, threads):
    assert fill_threads_for(0, cpus) == threads


def test_a_given_count_is_kept_and_auto_reads_the_process_affinity():
    assert fill_threads_for(5, cpus=64) == 5
    assert fill_threads_for(1, cpus=64) == 1
    with pytest.raises(ValueError, match="0 .one per two CPUs. or more"):
        fill_threads_for(-1)
    assert StructuredOutputConfig().fill_threads == 0  # the engine's default is auto
    assert fill_threads_for(0) == max(2, min(8, usable_cpus() // 2))
    assert usable_cpus() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("files", "cpus"),
    [
        ({"cpu.max": "max 100000\n"}, None),  # v2, no limit
        ({"cpu.max": "250000 100000\n"}, 3),  # v2: 2.5 CPUs, rounded up
        ({"cpu.max": "50000 100000\n"}, 1),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),  # no cgroup files
    ],
)
def test_a_containers_cpu_limit_caps_the_usable_cpus(tmp_path, files, cpus):
    """A container limited to a few CPUs on a large host gets threads for those few."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    affinity = len(os.sched_getaffinity(0))
    expected = affinity if cpus is None else min(affinity, cpus)
    assert usable_cpus(str(tmp_path)) == expected


def test_eight_threads_fill_what_a_loop_fills(qwen3):
    """Eight threads on whatever CPUs there are: the masks of many rows in many
    states, over several fills, equal the row-by-row loop's, guard included."""
    lc = LocalCompiler(qwen3, CompileOptions(max_whitespace=16))
    schemas = [
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
        {"type": "array", "items": {"type": "number"}},
        {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}},
    ]
    grammars = [lc.compile(GrammarSpec.of("json_schema", json.dumps(s))) for s in schemas]
    texts = ['{"a": "x y', "[1.5, 2, -3", '{\n  "tags": ["p", "q']
    rng = random.Random(7)
    guides = []
    for i in range(96):
        m = lc.matcher(grammars[i % 3])
        text = texts[i % 3]
        assert m.accept_string(text[: rng.randrange(len(text) + 1)])
        guides.append(RequestGuide(None, m))
    rows = list(range(len(guides)))
    threaded = BitmaskFiller(len(rows), qwen3.vocab_rows, batch_threshold=1, max_threads=8)
    looped = BitmaskFiller(len(rows), qwen3.vocab_rows, batch_threshold=10**6)
    threaded.guard = looped.guard = lc.guard
    try:
        assert threaded._shared.helpers == 7
        expected = looped.fill(rows, guides).buffer.clone()
        assert len({tuple(r.tolist()[:64]) for r in expected.numpy()}) >= 3  # masks differ
        for _ in range(20):
            got = threaded.fill(rows, guides)
            assert torch.equal(got.buffer, expected)
            assert np.array_equal(np.sort(got.rows), rows)
    finally:
        threaded.close()


def test_the_engine_fills_on_the_threads_its_setting_resolves_to(qwen3):
    from structured_output.manager import StructuredOutputManager

    for setting in (0, 3):
        config = StructuredOutputConfig(compile_workers=0, fill_threads=setting)
        manager = StructuredOutputManager(
            qwen3, reasoning_parser=None, max_num_seqs=8, config=config
        )
        try:
            assert manager.filler._shared.helpers == fill_threads_for(setting) - 1
        finally:
            manager.close()


def test_every_row_is_filled_once_and_an_error_reaches_the_caller(qwen3):
    """`SharedFill` over helpers, the first rows each a chunk of their own: each row
    gets its matcher's mask (as one fill of it alone gives), no other row is touched;
    an error raised on a helper is raised by ``fill``, and the next fill works."""
    from structured_output.bitmask import SharedFill

    lc = LocalCompiler(qwen3, CompileOptions(max_whitespace=16))
    g = lc.compile(GrammarSpec.of("json_schema", json.dumps({"type": "array"})))
    matchers = [lc.matcher(g) for _ in range(40)]
    for i, m in enumerate(matchers):  # states that differ from row to row
        assert m.accept_string("[" + "1," * (i % 5))
    words = (qwen3.vocab_rows + 31) // 32
    want = torch.zeros((44, words), dtype=torch.int32)
    for i, m in enumerate(matchers):  # the grammar's own mask (no guard: as SharedFill)
        xgr.GrammarMatcher.fill_next_token_bitmask(m, want, i)
    shared = SharedFill(helpers=3, chunk=4)
    try:
        for alone in (0, 3, 40):
            buf = torch.zeros((44, words), dtype=torch.int32)
            chunks: list[tuple[int, int]] = []

            def done(a: int, b: int, buf=buf, chunks=chunks) -> None:
                # on the calling thread, once the chunk's rows are filled
                assert threading.current_thread() is threading.main_thread()
                assert torch.equal(buf[a:b], want[a:b])
                chunks.append((a, b))

            before: list[int] = []  # runs once, before any chunk is reported

            def meanwhile(chunks=chunks, before=before) -> None:
                before.append(len(chunks))

            shared.fill(matchers, buf, list(range(40)), alone, done, meanwhile)
            assert torch.equal(buf, want), alone
            assert before == [0]
            assert sorted(i for a, b in chunks for i in range(a, b)) == list(range(40))
            assert sorted(chunks)[:alone] == [(i, i + 1) for i in range(alone)]
        chunks = []
        with pytest.raises(RuntimeError):  # a row past the buffer, in a helper's chunk
            shared.fill(matchers, buf, list(range(39)) + [99], 0, lambda a, b: chunks.append(b))
        assert 40 not in chunks  # the failed chunk is not reported filled
        buf.zero_()
        shared.fill(matchers[::-1], buf, list(range(39, -1, -1)))
        assert torch.equal(buf, want)
    finally:
        shared.close()
    # an error in the caller's own work (``done``, ``meanwhile``) is raised once every
    # row is filled, with helpers or without (no helper left writing, no hang)
    for helpers in (3, 0):
        shared = SharedFill(helpers=helpers, chunk=4)
        try:

            def fail(*_: int) -> None:
                raise ValueError("bookkeeping failed")

            for kw in ({"done": fail}, {"meanwhile": fail}):
                buf = torch.zeros((44, words), dtype=torch.int32)
                with pytest.raises(ValueError, match="bookkeeping failed"):
                    shared.fill(matchers, buf, list(range(40)), **kw)
                assert torch.equal(buf, want), (helpers, kw)
        finally:
            shared.close()
