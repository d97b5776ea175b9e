"""Stream and whole parse agree byte for byte on any text cut anywhere, in auto and
in forced mode: the family's example edited at random with its markers (whole, and
cut in halves), JSON and markup punctuation, prose and stop texts; and outputs of the
family's constraint (forced outputs in depth: test_forced_stream.py)."""

from __future__ import annotations

import functools
import random

import pytest
from hypothesis import strategies as st

from frontend.tool_formats import ToolFormat
from frontend.tool_formats.json_schema import JsonSchemaToolFormat
from tests.support.constrained_sampler import free_text_ends
from tests.support.properties import property_test
from tests.support.roundtrip import same_output, stream_parse
from tests.support.work import lines_run

from .conftest import EXAMPLE_TOOLS, FAMILIES, format_for, sampler_for
from .examples import EXAMPLES

GENERIC = [
    "{", "}", "[", "]", '"', "'", "\\", ":", ",", ";", " ", "\n", "\n\n", "(", ")", "=",
    "<", "</", ">", "<|", "|>", "name", '"name"', '"arguments"', '"parameters"', ": ",
    "get_weather", "get_time", '"get_weather"', "Paris", "true", "123", "-4.5e3",
    "null", "city", "Hello", "Sure, let me check.", "é中", "```", "```json", "\t",
    "functions.", "to=", "commentary", "final", "analysis", "<function=", "<parameter=",
    "</parameter>", "</function>", '<invoke name="', '">', "</invoke>", '<parameter name="',
    "'''", '"""', "\\'", ".", "True", "None", "1e999", "==", "<arg_key>", "[ARGS]",
]  # fmt: skip


@functools.cache
def fragments(family: str) -> list[str]:
    """Pieces to build adversarial text from, for one family."""
    fmt = format_for(family)
    markers = list(fmt.special_markers)
    halves = [m[: len(m) // 2] for m in markers] + [m[len(m) // 2 :] for m in markers]
    example = EXAMPLES[family][0]
    chunks = [example[i : i + 7] for i in range(0, len(example), 7)]
    stops = [fmt.tokenizer.decode([i]) for i in fmt.tokenizer.stop_token_ids]
    return sorted(set(GENERIC + markers + halves + chunks + stops + [example]))


@st.composite
def texts(draw: st.DrawFn, family: str) -> str:
    """The family's example (both calls, one, or none) with random edits: fragments
    inserted, spans deleted or repeated. Near-valid text reaches the paths where
    stream and whole parse could part."""
    pieces = fragments(family)
    text = draw(st.sampled_from([*EXAMPLES[family], ""]))
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        edit = draw(st.sampled_from(["insert", "delete", "repeat", "replace"]))
        if edit == "insert":
            text = text[:i] + draw(st.sampled_from(pieces)) + text[i:]
        elif edit == "delete":
            text = text[:i] + text[j:]
        elif edit == "repeat":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i] + draw(st.sampled_from(pieces)) + text[j:]
    return text


def cuts_for(text: str) -> st.SearchStrategy[list[int]]:
    """One-character pieces, or a few cuts anywhere."""
    points = st.lists(st.integers(1, max(1, len(text) - 1)), max_size=12)
    return st.one_of(st.just(list(range(1, len(text)))), points)


def check_agreement(
    fmt: ToolFormat,
    text: str,
    cuts: list[int],
    named: str | None = None,
    *,
    forced: bool = False,
) -> None:
    whole = fmt.parse(text, EXAMPLE_TOOLS, named=named, forced=forced)
    streamed = stream_parse(fmt, text, EXAMPLE_TOOLS, cuts, named, forced=forced)
    assert same_output(streamed, whole, compare_ids=fmt.name == "kimi_k2"), (text, cuts)


#: auto mode (calls held until they resolve) and forced mode (calls stream as read:
#: text no grammar would write must still stream as it parses whole)
MODES = pytest.mark.parametrize("forced", [False, True], ids=["auto", "forced"])


def _stream_equals_whole_on_adversarial_text(
    family: str, forced: bool, data: st.DataObject
) -> None:
    fmt = format_for(family)
    text = data.draw(texts(family))
    check_agreement(fmt, text, data.draw(cuts_for(text)), forced=forced)


def _json_schema_way_stream_equals_whole(
    named: str | None, forced: bool, data: st.DataObject
) -> None:
    fmt = JsonSchemaToolFormat(format_for("hermes").tokenizer)
    pieces = sorted(set(GENERIC + ['[{"name": "get_weather", "parameters": {"city": "Paris"}}]']))
    text = data.draw(st.lists(st.sampled_from(pieces), max_size=30).map("".join))
    check_agreement(fmt, text, data.draw(cuts_for(text)), named, forced=forced)


#: each property at half its former examples in the default run, ten times that in its
#: ``_full`` twin (``-m slow``)
EVERY_FAMILY = pytest.mark.parametrize("family", FAMILIES)
NAMED = pytest.mark.parametrize("named", [None, "get_weather"])
test_stream_equals_whole_on_adversarial_text = MODES(
    EVERY_FAMILY(property_test(_stream_equals_whole_on_adversarial_text, 50))
)
test_stream_equals_whole_on_adversarial_text_full = MODES(
    EVERY_FAMILY(property_test(_stream_equals_whole_on_adversarial_text, 500, slow=True))
)
test_json_schema_way_stream_equals_whole = MODES(
    NAMED(property_test(_json_schema_way_stream_equals_whole, 50))
)
test_json_schema_way_stream_equals_whole_full = MODES(
    NAMED(property_test(_json_schema_way_stream_equals_whole, 500, slow=True))
)


@pytest.mark.parametrize("family", FAMILIES)
def test_stream_equals_whole_on_constrained_output(family: str) -> None:
    """Outputs of the family's own constraint, cut into one-character pieces and at
    random."""
    fmt = format_for(family)
    sampler = sampler_for(fmt.tokenizer)
    spec = fmt.constraint(EXAMPLE_TOOLS, named=None, parallel=True)
    grammar = sampler.compile(spec)
    rng = random.Random(7)
    for _ in range(10):
        gen = sampler.generate(grammar, rng, free_text_ends=free_text_ends(spec))
        text = fmt.tokenizer.decode(gen.token_ids)
        check_agreement(fmt, text, list(range(1, len(text))))
        check_agreement(fmt, text, sorted(rng.sample(range(1, len(text)), 5)))


@MODES
@pytest.mark.parametrize("family", FAMILIES)
def test_work_per_push_is_proportional_to_new_text(family: str, forced: bool) -> None:
    """A long argument string pushed a character at a time: four times the text runs
    about four times the parser's lines (counted, not timed; a parser that rescanned
    its buffer would run sixteen times as many)."""
    fmt = format_for(family)
    example = EXAMPLES[family][1]
    head, _, tail = example.partition("Paris")

    def run(n: int) -> int:
        text = head + "word " * n + tail
        parser = fmt.new_parser(EXAMPLE_TOOLS, forced=forced)

        def push_all() -> None:
            for ch in text:
                parser.push(ch)
            parser.finish()

        return lines_run(push_all)

    small, large = run(250), run(1000)
    assert large < 5 * small, (small, large)
