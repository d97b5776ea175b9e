"""What the constraints admit, and what they never do: a marker spelled in pieces, a
marker or special token inside free text, unbounded whitespace, a second call where
one is allowed, values the parser would read differently; and the tools a syntax
cannot carry."""

from __future__ import annotations

import json
import random
import re

import pytest
import xgrammar as xgr

from frontend.tool_formats import FunctionTool, ToolFormat, ToolFormatError
from frontend.tool_formats.grammar import MAX_ENFORCED_LENGTH
from structured_output import CompileOptions, GrammarSpec, SpecKind
from tests.support.constrained_sampler import free_text_ends
from tests.support.roundtrip import call_errors

from .conftest import EXAMPLE_TOOLS, FAMILIES, format_for, json_schema_format, sampler_for
from .examples import EXAMPLES


def grammar(family: str, tools: tuple[FunctionTool, ...], named: str | None = None) -> object:
    """The compiled "required" constraint (compiles are cached per spec)."""
    fmt = format_for(family)
    spec = fmt.constraint(list(tools), named=named, parallel=True)
    return sampler_for(fmt.tokenizer).compile(spec)


def feed(fmt: ToolFormat, compiled: object, ids: list[int]) -> tuple[int, bool]:
    """How many of ``ids`` the grammar takes, and whether it may end after them."""
    matcher = xgr.GrammarMatcher(compiled)
    for k, tid in enumerate(ids):
        if not matcher.accept_token(tid):
            return k, False
    return len(ids), matcher.is_completed() or matcher.is_terminated()


def takes(fmt: ToolFormat, compiled: object, text: str) -> bool:
    ids = fmt.tokenizer.encode(text)
    return feed(fmt, compiled, ids) == (len(ids), True)


MARKED = [f for f in FAMILIES if format_for(f).special_markers and f != "llama3_json"]


@pytest.mark.parametrize("family", MARKED)
def test_markers_only_as_their_special_token(family: str) -> None:
    """The example with every marker spelled in ordinary tokens is refused before its
    first marker ends."""
    fmt = format_for(family)
    text = EXAMPLES[family][1]
    spelled = fmt.tokenizer.encode(text, special=False)
    taken, _ = feed(fmt, grammar(family, tuple(EXAMPLE_TOOLS)), spelled)
    first = min(text.find(m) for m in fmt.special_markers if m in text)
    assert len(fmt.tokenizer.decode(spelled[:taken])) < first + 1


@pytest.mark.parametrize("family", FAMILIES)
def test_no_marker_inside_an_argument(family: str) -> None:
    """Neither a family marker nor a bracketed special token of the vocabulary can
    appear inside an argument, as a token or spelled out."""
    fmt = format_for(family)
    tok = fmt.tokenizer
    text = EXAMPLES[family][1]
    head, _, tail = text.partition("Paris")
    compiled = grammar(family, tuple(EXAMPLE_TOOLS))
    intruders = (
        list(fmt.special_markers) + [t for t in tok.special_tokens if t.startswith("<|")][:3]
    )
    for marker in intruders:
        for special in (True, False):
            ids = (
                tok.encode(head + "Pa")
                + tok.encode(marker, special=special)
                + tok.encode("ris" + tail)
            )
            taken, _ = feed(fmt, compiled, ids)
            assert taken < len(ids), (marker, special)


JSON_ARGS = ["hermes", "llama3_json", "mistral", "deepseek_v3", "deepseek_v31", "kimi_k2", "openai"]


def guarded_takes(fmt: ToolFormat, compiled: object, text: str) -> bool:
    """Whether the engine's masks (grammar and guard) allow ``text`` token by token,
    and the grammar may end after it."""
    sampler = sampler_for(fmt.tokenizer)
    matcher = sampler.matcher(compiled)
    for tid in fmt.tokenizer.encode(text):
        if tid not in set(sampler.allowed(matcher).tolist()) or not matcher.accept_token(tid):
            return False
    return matcher.is_completed() or matcher.is_terminated()


@pytest.mark.parametrize("family", JSON_ARGS)
def test_whitespace_is_bounded(family: str) -> None:
    """The engine's bound holds in every JSON-argument family: the grammar itself
    allows any whitespace, the guard allows at most ``max_whitespace`` in a row."""
    limit = CompileOptions().max_whitespace
    assert limit is not None
    fmt = format_for(family)
    head, _, tail = EXAMPLES[family][1].partition('"city": "Paris"')
    compiled = grammar(family, tuple(EXAMPLE_TOOLS))
    within = '"city":' + " " * limit + '"Paris"'
    beyond = '"city":' + " " * (limit + 1) + '"Paris"'
    assert guarded_takes(fmt, compiled, head + within + tail)
    assert takes(fmt, compiled, head + beyond + tail)  # the grammar alone: unbounded
    assert not guarded_takes(fmt, compiled, head + beyond + tail)


def test_pythonic_has_no_free_whitespace() -> None:
    fmt = format_for("pythonic")
    compiled = grammar("pythonic", tuple(EXAMPLE_TOOLS))
    assert takes(fmt, compiled, "[get_weather(city='Paris')]")
    for loose in ("[ get_weather(city='Paris')]", "[get_weather(city = 'Paris')]"):
        assert not takes(fmt, compiled, loose)


ENUM_TOOL = FunctionTool(
    "set_mode",
    {
        "type": "object",
        "properties": {
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "count": {"type": "integer"},
            "on": {"type": "boolean"},
            "label": {"type": "string", "maxLength": 4},
            "meta": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
        "required": ["mode", "count"],
    },
)
XML_CASES = {
    "qwen3_coder": (
        "<tool_call>\n<function=set_mode>\n<parameter=mode>\n{mode}\n</parameter>\n"
        "<parameter=count>\n{count}\n</parameter>\n</function>\n</tool_call>"
    ),
    "glm45": (
        "<tool_call>set_mode\n<arg_key>mode</arg_key>\n<arg_value>{mode}</arg_value>\n"
        "<arg_key>count</arg_key>\n<arg_value>{count}</arg_value>\n</tool_call>"
    ),
    "minimax_m2": (
        '<minimax:tool_call>\n<invoke name="set_mode">\n<parameter name="mode">{mode}'
        '</parameter>\n<parameter name="count">{count}</parameter>\n</invoke>\n'
        "</minimax:tool_call>"
    ),
}


@pytest.mark.parametrize("family", sorted(XML_CASES))
def test_xml_values_admit_only_what_reads_back_valid(family: str) -> None:
    """No whitespace around an enum value or a number, no quotes around a number;
    and what is admitted parses to the schema's types."""
    fmt = format_for(family)
    compiled = grammar(family, (ENUM_TOOL,))
    case = XML_CASES[family]
    good = case.format(mode="fast", count="3")
    assert takes(fmt, compiled, good)
    parsed = fmt.parse(good, [ENUM_TOOL])
    assert json.loads(parsed.tool_calls[0].arguments) == {"mode": "fast", "count": 3}
    for mode, count in [(" fast", "3"), ("fast ", "3"), ("\nfast", "3"), ("fast", " 3"),
                        ("fast", '"3"'), ("FAST", "3"), ("fast", "3.5")]:  # fmt: skip
        assert not takes(fmt, compiled, case.format(mode=mode, count=count)), (mode, count)


@pytest.mark.parametrize("family", FAMILIES)
def test_string_length_bounds_hold(family: str) -> None:
    """A ``maxLength`` (up to `MAX_ENFORCED_LENGTH` inside JSON) is enforced."""
    fmt = format_for(family)
    tool = FunctionTool(
        "get_weather",
        {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": MAX_ENFORCED_LENGTH}},
            "required": ["city"],
        },
    )
    compiled = grammar(family, (tool,))
    text = EXAMPLES[family][1]
    if family == "pythonic":  # a bounded string is written as JSON (double quotes)
        text = text.replace("'Paris'", '"Paris"')
    fits = text.replace("Paris", "P" * MAX_ENFORCED_LENGTH)
    too_long = text.replace("Paris", "P" * (MAX_ENFORCED_LENGTH + 1))
    assert takes(fmt, compiled, fits)
    assert not takes(fmt, compiled, too_long)


@pytest.mark.parametrize("family", FAMILIES)
def test_names_the_syntax_cannot_carry_are_refused(family: str) -> None:
    fmt = format_for(family)
    schema = {"type": "object", "properties": {}}
    bad = ["x<y", "", "tab\there", "new\nline"]
    if family not in ("hermes", "llama3_json"):  # a JSON string carries a space
        bad.append("bad name")
    for name in bad:
        with pytest.raises(ToolFormatError):
            fmt.constraint([FunctionTool(name, schema)], named=None, parallel=True)
    with pytest.raises(ToolFormatError):
        fmt.constraint(EXAMPLE_TOOLS, named="missing", parallel=True)
    with pytest.raises(ToolFormatError):
        fmt.constraint([], named=None, parallel=True)


@pytest.mark.parametrize(
    ("family", "key"),
    [("qwen3_coder", "a>b"), ("glm45", "a<b"), ("minimax_m2", 'a"b'), ("pythonic", "class")],
)
def test_parameter_names_the_syntax_cannot_carry_are_refused(family: str, key: str) -> None:
    schema = {"type": "object", "properties": {key: {"type": "string"}}}
    with pytest.raises(ToolFormatError):
        format_for(family).constraint([FunctionTool("f", schema)], named=None, parallel=True)


def test_pythonic_values_are_python_literals() -> None:
    fmt = format_for("pythonic")
    tool = FunctionTool(
        "f",
        {
            "type": "object",
            "properties": {
                "on": {"type": "boolean"},
                "note": {"type": ["string", "null"]},
                "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
                "pos": {
                    "type": "object",
                    "properties": {"x": {"type": "number"}},
                    "required": ["x"],
                },
            },
            "required": ["on"],
        },
    )
    compiled = grammar("pythonic", (tool,))
    text = "[f(on=True, note=None, tags=[1, 2], pos={'x': -1.5})]"
    assert takes(fmt, compiled, text)
    assert json.loads(fmt.parse(text, [tool]).tool_calls[0].arguments) == {
        "on": True, "note": None, "tags": [1, 2], "pos": {"x": -1.5},
    }  # fmt: skip
    for bad in ["[f(on=true)]", "[f(on=True, note=null)]", "[f(on=True, tags=[1, 2, 3])]"]:
        assert not takes(fmt, compiled, bad), bad


def test_harmony_response_constraint_wraps_the_final_channel() -> None:
    fmt = format_for("openai")
    spec = GrammarSpec(SpecKind.JSON_SCHEMA, json.dumps({"type": "object", "properties": {
        "answer": {"type": "integer"}}, "required": ["answer"]}))  # fmt: skip
    wrapped = fmt.response_constraint(spec)
    assert wrapped.kind == SpecKind.STRUCTURAL_TAG
    compiled = sampler_for(fmt.tokenizer).compile(wrapped)
    for text in [
        '<|channel|>final<|message|>{"answer": 42}',
        '<|start|>assistant<|channel|>final<|message|>{"answer": 42}<|return|>',
    ]:
        assert takes(fmt, compiled, text)
        assert fmt.parse(text, []).content == '{"answer": 42}'
    assert not takes(fmt, compiled, '<|channel|>final<|message|>{"answer": "x"}')
    for kind, value, text in [
        (SpecKind.REGEX, "[a-z]+", "abc"),
        (SpecKind.CHOICE, '["yes", "no"]', "no"),
        (SpecKind.GRAMMAR, 'root ::= "hi"', "hi"),
        (SpecKind.JSON_OBJECT, "", "{}"),
    ]:
        compiled = sampler_for(fmt.tokenizer).compile(
            fmt.response_constraint(GrammarSpec(kind, value))
        )
        assert takes(fmt, compiled, "<|channel|>final<|message|>" + text), kind


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "openai"])
def test_other_families_leave_response_formats_alone(family: str) -> None:
    spec = GrammarSpec(SpecKind.REGEX, "[a-z]+")
    assert format_for(family).response_constraint(spec) is spec


@pytest.mark.parametrize("vocab", ["qwen3", "llama3"])
def test_json_schema_way(vocab: str) -> None:
    fmt = json_schema_format(vocab)
    sampler = sampler_for(fmt.tokenizer)
    required = sampler.compile(fmt.constraint(EXAMPLE_TOOLS, named=None, parallel=True))
    single = sampler.compile(fmt.constraint(EXAMPLE_TOOLS, named=None, parallel=False))
    named = sampler.compile(fmt.constraint(EXAMPLE_TOOLS, named="get_time", parallel=True))
    two = (
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
        '{"name": "get_time", "parameters": {"tz": "CET"}}]'
    )
    assert takes(fmt, required, two)
    assert not takes(fmt, single, two)
    assert not takes(fmt, required, "[]")
    assert takes(fmt, named, '{"tz": "CET"}')
    parsed = fmt.parse(two, EXAMPLE_TOOLS)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", '{"tz": "CET"}'),
    ]
    by_name = fmt.parse('{"tz": "CET"}', EXAMPLE_TOOLS, named="get_time")
    assert [(c.name, c.arguments) for c in by_name.tool_calls] == [("get_time", '{"tz": "CET"}')]


@pytest.mark.parametrize("family", FAMILIES)
def test_tools_without_a_schema_take_any_object(family: str) -> None:
    """Parameters None (or ``strict: false``): any JSON object of arguments."""
    fmt = format_for(family)
    tools = [
        FunctionTool("get_weather", None),
        FunctionTool("get_time", {"type": "object"}, strict=False),
    ]
    sampler = sampler_for(fmt.tokenizer)
    spec = fmt.constraint(tools, named=None, parallel=True)
    compiled = sampler.compile(spec)
    for k in range(5):
        gen = sampler.generate(compiled, random.Random(k), free_text_ends=free_text_ends(spec))
        if gen.finished:
            parsed = fmt.parse(fmt.tokenizer.decode(gen.token_ids), tools)
            assert call_errors(parsed, tools, None, True) == []


def _forced_spans(fmt: ToolFormat, compiled: object, text: str) -> list[bool] | None:
    """Walking ``text`` token by token: per character, whether the grammar forced it
    (`find_jump_forward_string` at some point covered it, as jump forward appends
    it); None if the grammar refuses ``text``."""
    tok = fmt.tokenizer
    matcher = xgr.GrammarMatcher(compiled)
    forced = [False] * len(text)
    pos = 0
    for tid in tok.encode(text):
        ahead = matcher.find_jump_forward_string()
        if ahead and text.startswith(ahead, pos):
            forced[pos : pos + len(ahead)] = [True] * len(ahead)
        if not matcher.accept_token(tid):
            return None
        pos += len(tok.decode([tid]))
    return forced


@pytest.mark.parametrize("family", FAMILIES)
def test_a_named_call_forces_its_name_and_a_call_objects_header(family: str) -> None:
    """A named call of the family, written as its chat template writes it: the grammar
    takes it, and forces the tool's name (jump forward appends it). Where the call is
    a JSON call object, its whole header is forced, spaced as the templates space it
    (``", "arguments": {``), and a header spaced otherwise, which the parser reads
    alike, is refused; under "required" with two tools its whitespace stays free."""
    fmt = format_for(family)
    canonical = EXAMPLES[family][1]
    spec = fmt.constraint(list(EXAMPLE_TOOLS), named="get_weather", parallel=True)
    named = sampler_for(fmt.tokenizer).compile(spec)
    forced = _forced_spans(fmt, named, canonical)
    assert forced is not None, canonical
    at = canonical.index("get_weather")
    assert all(forced[at : at + len("get_weather")]), canonical
    header = re.search(r'\{"name": "get_weather", "(arguments|parameters)": \{', canonical)
    if header is None:
        return  # not a call object
    seps = canonical.index('", "', header.start())
    assert all(forced[seps : header.end()]), canonical[seps : header.end()]
    key = header.group(1)
    compact = canonical.replace('"name": ', '"name":').replace(f', "{key}"', f',"{key}"')
    assert not takes(fmt, named, compact)
    either = grammar(family, tuple(EXAMPLE_TOOLS))
    assert takes(fmt, either, canonical) and takes(fmt, either, compact)
