"""What real models write in "auto" mode, where nothing constrains them: near-miss
outputs (`near_miss`) for every registered family and the JSON-schema way, and the
three rules every parser keeps for every input (frontend/tool_formats/README.md):

1. a returned call names one of the request's tools and its arguments are one JSON
   object;
2. no text is lost: each prose word and each tool name of the input is found in the
   content, in a call's arguments, or (a name) as a returned call's name, exactly as
   often as in the input; the content is made of the input's characters, in order;
3. the stream equals the whole parse, for every chunking.

Besides: whitespace next to a special marker never loses a call, and the defects
found in auto mode stay fixed.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import strategies as st

from frontend.tool_formats import FunctionTool, ParsedOutput, ToolFormat
from frontend.tool_formats.json_text import is_json_object
from tests.support.properties import property_test
from tests.support.roundtrip import same_output, stream_parse

from .conftest import EXAMPLE_TOOLS, FAMILIES, format_for
from .near_miss import EDITS, JSON_WAY, SENTINEL, SPACES, edit, format_of, valid_outputs

ALL = [*FAMILIES, JSON_WAY]


def is_subsequence(part: str, whole: str) -> bool:
    it = iter(whole)
    return all(ch in it for ch in part)


def word_count(text: str, word: str) -> int:
    return len(re.findall(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", text))


def check_rules(
    fmt: ToolFormat, tools: list[FunctionTool], text: str, cuts: list[int]
) -> ParsedOutput:
    """The three rules for ``text``; returns the whole parse."""
    whole = fmt.parse(text, tools)
    again = fmt.parse(text, tools)
    ids_from_text = [c.id for c in whole.tool_calls] == [c.id for c in again.tool_calls]
    streamed = stream_parse(fmt, text, tools, cuts)
    assert same_output(streamed, whole, compare_ids=ids_from_text), (text, cuts)

    names = {t.name for t in tools}
    for call in whole.tool_calls:
        assert call.name in names, (text, call)
        assert is_json_object(call.arguments), (text, call)

    content = whole.content or ""
    assert is_subsequence(content, text), (text, content)
    arguments = [c.arguments for c in whole.tool_calls]
    for word in set(SENTINEL.findall(text)):
        found = content.count(word) + sum(a.count(word) for a in arguments)
        assert found == text.count(word), (text, word, whole)
    for name in names:
        calls = sum(c.name == name for c in whole.tool_calls)
        found = word_count(content, name) + sum(word_count(a, name) for a in arguments)
        assert found + calls == word_count(text, name), (text, name, whole)
    return whole


def chunkings(text: str) -> st.SearchStrategy[list[int]]:
    """One-character pieces, or a few cuts anywhere."""
    points = st.lists(st.integers(1, max(1, len(text) - 1)), max_size=10)
    return st.one_of(st.just(list(range(1, len(text)))), points)


def _near_miss_outputs_keep_the_rules(family: str, data: st.DataObject) -> None:
    fmt = format_of(family)
    sample = data.draw(st.sampled_from(valid_outputs(family)))
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    text = sample.text
    for kind in data.draw(st.lists(st.sampled_from(EDITS), max_size=4), label="edits"):
        text = edit(fmt, sample, kind, text, rng)
    if data.draw(st.booleans(), label="truncate"):
        text = text[: data.draw(st.integers(0, len(text)), label="at")]
    check_rules(fmt, list(sample.tools), text, data.draw(chunkings(text), label="cuts"))


EVERY_FAMILY = pytest.mark.parametrize("family", ALL)
test_near_miss_outputs_keep_the_rules = EVERY_FAMILY(
    property_test(_near_miss_outputs_keep_the_rules, 40)
)
test_near_miss_outputs_keep_the_rules_full = EVERY_FAMILY(
    property_test(_near_miss_outputs_keep_the_rules, 400, slow=True)
)


@pytest.mark.parametrize("family", ALL)
def test_valid_outputs_truncated_at_every_position(family: str) -> None:
    fmt = format_of(family)
    sample = min(valid_outputs(family), key=lambda s: len(s.text))
    text = sample.text
    rng = random.Random(len(text))
    full = fmt.parse(text, list(sample.tools))
    assert full.tool_calls and full.content is None, (text, full)
    for end in range(len(text) + 1):
        prefix = text[:end]
        cuts = sorted(rng.sample(range(1, max(end, 2)), min(3, max(end - 1, 0))))
        check_rules(fmt, list(sample.tools), prefix, cuts)


@pytest.mark.parametrize("family", ALL)
def test_whitespace_next_to_special_markers_loses_no_call(family: str) -> None:
    fmt = format_of(family)
    markers = fmt.special_markers
    rng = random.Random(7)
    for sample in valid_outputs(family):
        tools = list(sample.tools)
        clean = [c.name for c in fmt.parse(sample.text, tools).tool_calls]
        assert clean, sample.text
        pattern = "|".join(map(re.escape, sorted(markers, key=len, reverse=True)))
        for _ in range(3 if markers else 0):
            spaced = re.sub(
                pattern or "(?!)",
                lambda m: rng.choice(SPACES) + m.group() + rng.choice(("", *SPACES)),
                sample.text,
            )
            parsed = check_rules(fmt, tools, spaced, [])
            assert [c.name for c in parsed.tool_calls] == clean, spaced


# ----- the defects found in auto mode --------------------------------------------

WEATHER = ("get_weather", {"city": "Paris"})
TIME = ("get_time", {"tz": "CET"})


def read(family: str, text: str) -> tuple[str | None, list[tuple[str, object]]]:
    parsed = check_rules(format_for(family), EXAMPLE_TOOLS, text, list(range(1, len(text))))
    return parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


@pytest.mark.parametrize(
    "text",
    [
        # the <function=NAME line not closed
        "<tool_call>\n<function=get_weather\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>",
        # a parameter without </parameter>
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
        # a parameter name not closed
        "<tool_call>\n<function=get_weather>\n<parameter=city\nParis\n</parameter>\n"
        "</function>\n</tool_call>",
    ],
)
def test_qwen3_coder_unclosed_markup(text: str) -> None:
    assert read("qwen3_coder", text) == (None, [WEATHER])


def test_qwen3_coder_a_missing_closer_before_the_next_parameter() -> None:
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    assert read("qwen3_coder", text) == (None, [("get_weather", {"city": "Paris", "days": 3})])


def test_llama3_calls_one_per_line() -> None:
    text = (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}\n'
        '{"name": "get_time", "parameters": {"tz": "CET"}}'
    )
    assert read("llama3_json", text) == (None, [WEATHER, TIME])


def test_kimi_spaces_around_the_call_id() -> None:
    text = (
        "<|tool_calls_section_begin|> <|tool_call_begin|> functions.get_weather:0 "
        '<|tool_call_argument_begin|> {"city": "Paris"} <|tool_call_end|> '
        "<|tool_calls_section_end|>"
    )
    assert read("kimi_k2", text) == (None, [WEATHER])


@pytest.mark.parametrize(
    "call",
    [
        'function<｜tool▁sep｜>get_weather```json{"city": "Paris"}```',
        'function<｜tool▁sep｜>get_weather\n{"city": "Paris"}',
        'function <｜tool▁sep｜> get_weather\n```json\n{"city": "Paris"}\n```',
    ],
)
def test_deepseek_v3_without_the_template_newlines(call: str) -> None:
    begin = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
    text = begin + call + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    assert read("deepseek_v3", text) == (None, [WEATHER])


@pytest.mark.parametrize(
    "text",
    [
        "[get_weather('Paris')]",
        "[get_weather(city='Paris'",
        "[get_weather(city=Paris)]",
        "[get_weather(city='Paris' tz='CET')]",
    ],
)
def test_pythonic_positional_or_broken_python_is_content(text: str) -> None:
    assert read("pythonic", text) == (text, [])


@pytest.mark.parametrize("opening", ["", "<|start|>assistant"])
def test_harmony_a_header_cut_short_by_the_next_message_is_kept(opening: str) -> None:
    """A call header that never reaches ``<|message|>`` before the next message's
    ``<|channel|>`` was read as part of that message's header, and lost."""
    broken = opening + '<|channel|>commentary to=functions.get_weather json{"city": "Paris"}\n'
    good = '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": "CET"}'
    content, calls = read("openai", broken + good)
    assert calls == [TIME]
    assert content is not None and content.startswith(broken.rstrip())
