"""Forced calls, generated under each family's constraint by the adversarial sampler,
come back as valid calls: at least one call (exactly one without parallel calls or
for a named function; the named one), each a tool of the request with arguments
that are JSON and valid for its schema, in every generation that finished; at least
90% finish within 512 tokens; the stream parse equals the whole parse.

CI runs five tool sets per family with two generations of each grammar (40
generations, as many as ten tool sets give, from half their compiles: a compile costs
far more than a generation); ``-m slow`` runs 100 tool sets with one generation each
and prints the figures::

    python -m pytest tests/tool_formats/test_roundtrip.py -m slow -s -n0
"""

from __future__ import annotations

import zlib

import pytest

from tests.support.roundtrip import RoundTrip, round_trip
from tests.support.toolsets import tool_sets

from .conftest import FAMILIES, format_for, json_schema_format, sampler_for

CI_TOOL_SETS = 5
#: generations of each grammar in the default run
CI_SAMPLES = 2
FULL_TOOL_SETS = 100
MIN_FINISHED_PCT = 90.0


def seed_of(name: str) -> int:
    return zlib.crc32(name.encode())


def check(stats: RoundTrip) -> None:
    assert not stats.failures, "\n".join(stats.failures[:5])
    assert stats.finished_pct >= MIN_FINISHED_PCT, stats.row()


def run_family(family: str, count: int, samples: int = 1) -> RoundTrip:
    fmt = format_for(family)
    seed = seed_of(family)
    sampler = sampler_for(fmt.tokenizer)
    return round_trip(family, fmt, sampler, tool_sets(seed, count), seed=seed, samples=samples)


def run_json_schema_way(vocab: str, count: int, samples: int = 1) -> RoundTrip:
    fmt = json_schema_format(vocab)
    seed = seed_of(vocab)
    return round_trip(
        f"json_schema/{vocab}",
        fmt,
        sampler_for(fmt.tokenizer),
        tool_sets(seed, count),
        seed=seed,
        samples=samples,
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_forced_calls_round_trip(family: str) -> None:
    check(run_family(family, CI_TOOL_SETS, CI_SAMPLES))


@pytest.mark.parametrize("vocab", ["qwen3", "llama3"])
def test_json_schema_way_round_trip(vocab: str) -> None:
    check(run_json_schema_way(vocab, CI_TOOL_SETS, CI_SAMPLES))


@pytest.mark.slow
def test_forced_calls_round_trip_full() -> None:
    """100 tool sets per family; prints a table of the figures."""
    rows = [run_family(f, FULL_TOOL_SETS) for f in FAMILIES]
    rows += [run_json_schema_way(v, FULL_TOOL_SETS) for v in ("qwen3", "llama3")]
    print("\n" + RoundTrip.HEADER)
    for stats in rows:
        print(stats.row())
    for stats in rows:
        check(stats)
