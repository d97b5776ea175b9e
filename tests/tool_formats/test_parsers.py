"""How each parser reads what a model writes without a constraint: prose around
calls, stop texts, unterminated and malformed calls, markers where they do not
belong, values converted by schema, and each family's variants."""

from __future__ import annotations

import json

import pytest

from frontend.tool_formats import FunctionTool, ParsedOutput, ToolFormat
from frontend.tool_formats.scanning import MAX_HEADER
from tests.support.roundtrip import same_output, stream_parse

from .conftest import EXAMPLE_TOOLS, FAMILIES, format_for, json_schema_format
from .examples import EXAMPLES


def calls(parsed: ParsedOutput) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in parsed.tool_calls]


def parse(family: str, text: str, tools: list[FunctionTool] = EXAMPLE_TOOLS) -> ParsedOutput:
    return format_for(family).parse(text, tools)


WEATHER = ("get_weather", '{"city": "Paris"}')


@pytest.mark.parametrize("family", FAMILIES)
def test_prose_around_calls_is_content(family: str) -> None:
    single = EXAMPLES[family][1]
    if family in ("llama3_json", "pythonic"):  # calls only at the start of the output
        parsed = parse(family, single + "\n\nDone.")
        assert (parsed.content, calls(parsed)) == ("Done.", [WEATHER])
        return
    parsed = parse(family, "Let me check.\n\n" + single + "\nOne moment.\n")
    assert calls(parsed) == [WEATHER]
    if family != "openai":
        assert parsed.content == "Let me check.\n\n\nOne moment."


@pytest.mark.parametrize("family", FAMILIES)
def test_text_without_calls_is_all_content(family: str) -> None:
    for text in ["Hello!\n", "  Paris is sunny. {not: json} [x] <b>bold</b>  "]:
        parsed = parse(family, text)
        assert parsed.tool_calls == []
        assert parsed.content == text


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stop_text_at_the_end_is_dropped(family: str) -> None:
    fmt = format_for(family)
    single = EXAMPLES[family][1]
    for stop in fmt.tokenizer.stop_token_ids:
        parsed = fmt.parse(single + fmt.tokenizer.decode([stop]), EXAMPLE_TOOLS)
        assert calls(parsed) == [WEATHER]
        assert parsed.content is None


def test_a_stop_text_inside_the_output_is_kept() -> None:
    parsed = parse("hermes", "a <|im_end|> b")
    assert parsed.content == "a <|im_end|> b"


@pytest.mark.parametrize(
    ("family", "cut"),
    [
        ("hermes", "\n</tool_call>"),
        ("qwen3_coder", "</tool_call>"),
        ("deepseek_v3", "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        ("deepseek_v31", "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        ("kimi_k2", "<|tool_call_end|><|tool_calls_section_end|>"),
        ("glm45", "</tool_call>"),
        ("minimax_m2", "</invoke>\n</minimax:tool_call>"),
        ("openai", "<|call|>"),
    ],
)
def test_an_unterminated_last_call_is_read(family: str, cut: str) -> None:
    single = EXAMPLES[family][1]
    assert single.endswith(cut)
    parsed = parse(family, single[: -len(cut)])
    assert calls(parsed) == [WEATHER]
    assert parsed.content is None


def test_a_header_that_is_not_a_call_stays_content() -> None:
    text = "x <tool_call> not json </tool_call> y"
    assert parse("hermes", text) == ParsedOutput(content=text, tool_calls=[])
    text = '<tool_call>\n{"arguments": {}, "name": "f"}</tool_call>'
    assert parse("hermes", text).tool_calls == []


def test_a_header_never_held_beyond_its_limit() -> None:
    """A header still undecided after `MAX_HEADER` characters is content, however the
    text arrives."""
    fmt = format_for("hermes")
    text = '<tool_call>{"name": "' + "n" * MAX_HEADER + '", "arguments": {}}</tool_call>'
    whole = fmt.parse(text, EXAMPLE_TOOLS)
    assert whole == ParsedOutput(content=text, tool_calls=[])
    assert same_output(stream_parse(fmt, text, EXAMPLE_TOOLS, range(len(text))), whole,
                       compare_ids=False)  # fmt: skip


def test_arguments_cut_short_by_a_marker_are_not_a_call() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa</tool_call>'
    assert parse("hermes", text) == ParsedOutput(content=text, tool_calls=[])


def test_a_new_call_marker_ends_an_open_call_which_is_content() -> None:
    cut = '<tool_call>{"name": "get_time", "arguments": {"tz": 1'
    text = cut + '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
    parsed = parse("hermes", text)
    assert (parsed.content, calls(parsed)) == (cut, [WEATHER])


def test_a_name_that_is_no_tool_is_not_a_call() -> None:
    for family in FAMILIES:
        text = EXAMPLES[family][1].replace("get_weather", "get_wind")
        parsed = parse(family, text)
        assert parsed.tool_calls == [], family
        assert "get_wind" in (parsed.content or ""), family


def test_arguments_keep_the_models_text() -> None:
    text = '<tool_call>{"name":"f","parameters":{ "q" : [1,2,{"x":"}\\""}] }}</tool_call>'
    parsed = parse("hermes", text, [FunctionTool("f")])
    assert calls(parsed) == [("f", '{ "q" : [1,2,{"x":"}\\""}] }')]
    for not_an_object in ("[1]", '"x"', '{"a": NaN}', '{"a": tru}'):
        text = '<tool_call>{"name": "f", "arguments": ' + not_an_object + "}</tool_call>"
        assert parse("hermes", text, [FunctionTool("f")]).tool_calls == [], not_an_object


RICH = FunctionTool(
    "f",
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "on": {"type": "boolean"},
            "obj": {"type": "object"},
            "arr": {"type": "array", "items": {"type": "string"}},
            "maybe": {"type": ["string", "null"]},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "text": {"type": "string"},
        },
    },
)


def qwen_call(params: dict[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"


def test_xml_values_read_by_schema() -> None:
    text = qwen_call(
        {
            "n": "3",
            "x": "-2.5e3",
            "on": "true",
            "obj": '{"a": "</parameter>", "b": [1]}',
            "arr": '["x", "y"]',
            "maybe": "null",
            "mode": "b",
            "text": "\nline one\n  line two\n",
            "extra": "7",
        }
    )
    args = json.loads(parse("qwen3_coder", text, [RICH]).tool_calls[0].arguments)
    assert args == {
        "n": 3,
        "x": -2500.0,
        "on": True,
        "obj": {"a": "</parameter>", "b": [1]},
        "arr": ["x", "y"],
        "maybe": None,
        "mode": "b",
        "text": "\nline one\n  line two\n",
        "extra": 7,
    }


def test_xml_values_that_are_not_json_read_as_strings() -> None:
    text = qwen_call({"n": "three", "maybe": "Paris", "on": "True", "x": "NaN"})
    args = json.loads(parse("qwen3_coder", text, [RICH]).tool_calls[0].arguments)
    assert args == {"n": "three", "maybe": "Paris", "on": "True", "x": "NaN"}


def test_xml_text_values_are_verbatim_where_the_markup_has_no_newlines() -> None:
    text = (
        '<minimax:tool_call>\n<invoke name="f">\n<parameter name="text"> a "quoted"\n'
        "</parameter>\n</invoke>\n</minimax:tool_call>"
    )
    args = json.loads(parse("minimax_m2", text, [RICH]).tool_calls[0].arguments)
    assert args == {"text": ' a "quoted"\n'}


def test_glm47_without_newlines() -> None:
    text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    assert calls(parse("glm45", text)) == [WEATHER]


def test_pythonic_reads_literals_without_evaluating() -> None:
    text = (
        "[get_weather(city=\"Par\\u00eds\", days=-3, ok=True, tags=('a', 'b'), none=None, "
        "nested={'k': [1.5, False]}, doc='''x'''), get_time()]"
    )
    parsed = parse("pythonic", text)
    assert calls(parsed) == [
        (
            "get_weather",
            '{"city": "París", "days": -3, "ok": true, "tags": ["a", "b"], "none": null, '
            '"nested": {"k": [1.5, false]}, "doc": "x"}',
        ),
        ("get_time", "{}"),
    ]
    for bad in [
        "[get_weather(city=__import__('os').system('true'))]",
        "[get_weather('Paris')]",
        "[get_weather(city=float('inf'))]",
        "[get_weather(city={1, 2})]",
        "[get_weather(city='Paris'",
        "[get_weather(city='Paris' tz='CET')]",
        "[1, 2, 3]",
    ]:
        assert parse("pythonic", bad) == ParsedOutput(content=bad, tool_calls=[]), bad
    parsed = parse("pythonic", "[get_weather(city='Paris'), get_time('CET')]")
    assert (parsed.content, calls(parsed)) == ("get_time('CET')]", [WEATHER])


def test_harmony_messages() -> None:
    text = (
        "<|channel|>analysis<|message|>thinking<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
        "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>"
        ' {"tz": "CET"}<|call|>'
    )
    parsed = parse("openai", text)
    assert parsed.content == "Checking."
    assert calls(parsed) == [("get_time", '{"tz": "CET"}')]
    final = parse("openai", "<|start|>assistant<|channel|>final<|message|>It is 9.<|return|>")
    assert (final.content, final.tool_calls) == ("It is 9.", [])


def test_mistral_older_array_form() -> None:
    text = (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"tz": "CET"}}]'
    )
    assert calls(parse("mistral", text)) == [WEATHER, ("get_time", '{"tz": "CET"}')]


def test_llama3_without_python_tag_and_not_a_call() -> None:
    assert calls(
        parse("llama3_json", '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    ) == [WEATHER]
    answer = '{"answer": 42}'
    assert parse("llama3_json", answer) == ParsedOutput(content=answer, tool_calls=[])


@pytest.mark.parametrize("vocab", ["qwen3", "llama3"])
def test_json_schema_way_reads_plain_json(vocab: str) -> None:
    fmt: ToolFormat = json_schema_format(vocab)
    assert fmt.parse("Sorry, no.", EXAMPLE_TOOLS).content == "Sorry, no."
    parsed = fmt.parse('  {"city": "Paris"} trailing', EXAMPLE_TOOLS, named="get_weather")
    assert (calls(parsed), parsed.content) == ([WEATHER], "trailing")
    prose = fmt.parse("Sorry, no.", EXAMPLE_TOOLS, named="get_weather")
    assert (prose.content, prose.tool_calls) == ("Sorry, no.", [])


def test_one_push_gives_one_piece_per_call() -> None:
    fmt = format_for("hermes")
    parser = fmt.new_parser(EXAMPLE_TOOLS)
    delta = parser.push(EXAMPLES["hermes"][0])
    assert [(d.index, d.name, d.arguments) for d in delta.tool_calls] == [
        (0, "get_weather", '{"city": "Paris"}'),
        (1, "get_time", '{"tz": "CET"}'),
    ]
