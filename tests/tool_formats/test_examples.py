"""Each family's FORMATS.md example: it parses to exactly the expected calls, whole
and split at every point, and its constraint accepts that very text token by token
(markers as their special-token ids)."""

from __future__ import annotations

import functools
import re

import pytest
import xgrammar as xgr

from frontend.tool_formats import ToolFormat
from tests.support.roundtrip import same_output, stream_parse

from .conftest import EXAMPLE_TOOLS, FAMILIES, format_for, sampler_for, tokenizer_for
from .examples import EXAMPLES, TIME_ARGS, WEATHER_ARGS

_UUID_ID = re.compile(r"chatcmpl-tool-[0-9a-f]{32}")


def expected_calls(family: str) -> list[tuple[str, str]]:
    calls = [("get_weather", WEATHER_ARGS)]
    if family != "openai":
        calls.append(("get_time", TIME_ARGS))
    return calls


def test_every_family_has_an_example() -> None:
    assert set(EXAMPLES) == set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_example_parses_to_the_expected_calls(family: str) -> None:
    fmt = format_for(family)
    text, single = EXAMPLES[family]
    parsed = fmt.parse(text, EXAMPLE_TOOLS)
    assert parsed.content is None
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == expected_calls(family)
    one = fmt.parse(single, EXAMPLE_TOOLS)
    assert one.content is None
    assert [(c.name, c.arguments) for c in one.tool_calls] == [("get_weather", WEATHER_ARGS)]
    ids = [c.id for c in parsed.tool_calls]
    assert len(set(ids)) == len(ids)
    if family == "kimi_k2":
        assert ids == ["functions.get_weather:0", "functions.get_time:1"]
    elif family == "mistral":
        assert all(len(i) == 9 and i.isalnum() for i in ids)
    else:
        assert all(_UUID_ID.fullmatch(i) for i in ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_example_split_at_every_point(family: str) -> None:
    fmt = format_for(family)
    text = EXAMPLES[family][0]
    whole = fmt.parse(text, EXAMPLE_TOOLS)
    for cut in range(1, len(text)):
        streamed = stream_parse(fmt, text, EXAMPLE_TOOLS, [cut])
        assert same_output(streamed, whole, compare_ids=family == "kimi_k2"), cut


@functools.cache
def compiled(family: str, named: str | None, parallel: bool) -> xgr.CompiledGrammar:
    fmt = format_for(family)
    spec = fmt.constraint(EXAMPLE_TOOLS, named=named, parallel=parallel)
    return sampler_for(fmt.tokenizer).compile(spec)


def accepts(fmt: ToolFormat, grammar: xgr.CompiledGrammar, text: str) -> bool:
    """Whether the grammar takes ``text``'s token ids and may end there (a stop token
    at the end, as Harmony's ``<|call|>``, must end it)."""
    matcher = xgr.GrammarMatcher(grammar)
    for tid in fmt.tokenizer.encode(text):
        if not matcher.accept_token(tid):
            return False
    return matcher.is_completed() or matcher.is_terminated()


@pytest.mark.parametrize("family", FAMILIES)
def test_constraint_accepts_the_example(family: str) -> None:
    fmt = format_for(family)
    both, single = EXAMPLES[family]
    assert accepts(fmt, compiled(family, None, True), both)
    for named in (None, "get_weather"):
        for parallel in (True, False):
            assert accepts(fmt, compiled(family, named, parallel), single), (named, parallel)
    if family != "openai":
        assert not accepts(fmt, compiled(family, None, False), both)
        assert not accepts(fmt, compiled(family, "get_weather", True), both)
        assert not accepts(fmt, compiled(family, "get_time", True), single)


@pytest.mark.parametrize("family", FAMILIES)
def test_example_tokens_mark_markers_as_special(family: str) -> None:
    """The vocabulary a family is tested on has each of its markers as one token."""
    tok = tokenizer_for(family)
    for marker in format_for(family).special_markers:
        assert tok.encode(marker) == [tok.special_tokens[marker]]
