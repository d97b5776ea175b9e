"""Front end + a spawned engine + the scripted model, qwen3 reasoning and hermes calls.

Every case runs twice, whole and streamed, and the stream's deltas must fold into
exactly the whole response (reasoning, content, call names and arguments, finish
reason, usage). The scripted model writes its script wherever the grammar allows it;
where the grammar does not (a malformed call, a call with thinking off), the mask
decides.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import jsonschema
import msgspec
import pytest

from frontend.config import ConfigError
from frontend.protocol import ChatCompletion, ChatCompletionChunk, ErrorResponse
from frontend.validation import RequestError
from ipc import FinishReason
from tests.support.weather import SCHEMAS, TOOLS, call
from tokenization import load_tokenizer

TOK = load_tokenizer("qwen3")
PLUGIN = str(Path(__file__).with_name("toy_format.py"))
FORMAT = "hermes"


ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}},
    "required": ["city", "temp_c"],
    "additionalProperties": False,
}

THINK = "<think>\nThe user asks about {}. I will use a tool.\n</think>\n\n"
RULES = [
    {
        "match": "weather in Paris",
        "output": THINK.format("Paris") + call("get_weather", {"city": "Paris"}),
    },
    {"match": "Quick: weather in Rome", "output": call("get_weather", {"city": "Rome"})},
    {
        "match": "time in Tokyo",
        "output": THINK.format("Tokyo") + call("get_time", {"tz": "Asia/Tokyo"}),
    },
    {
        "match": "Both Oslo and Lima",
        "output": THINK.format("two cities")
        + call("get_weather", {"city": "Oslo"})
        + "\n"
        + call("get_weather", {"city": "Lima"}),
    },
    {
        "match": "Broken call",
        "output": THINK.format("a broken call")
        + '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris", "days": }}\n'
        + "</tool_call>",
    },
    {
        "match": "Call while thinking",
        # no </think>: <tool_call> ends the thinking and is the answer's first token
        "output": "<think>\nI will call it right away " + call("get_weather", {"city": "Nice"}),
    },
    {
        "match": "Plugin format",
        "output": THINK.format("a plugin")
        + '<call>{"name": "get_time", "arguments": {"tz": "UTC"}}</call>',
    },
    {
        "match": "JSON answer",
        "output": "<think>\nI know this one.\n</think>\n\n" + '{"city": "Paris", "temp_c": 21}',
    },
    {
        "match": "Tell a story",
        "output": "<think>\nA short story.\n</think>\n\n"
        + "Once upon a time a STOP sign fell. The end.",
    },
    {
        "match": "Chat freely",
        "output": THINK.format("free chat") + "Let me check. " + call("get_time", {"tz": "UTC"}),
    },
]


@pytest.fixture(scope="module")
def engine(engine_factory):
    return engine_factory(RULES, reasoning_parser="qwen3")


@pytest.fixture(scope="module")
def fe(engine):
    return engine.frontend(tool_call_parser=FORMAT, enable_auto_tool_choice=True)


def body(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], "seed": 7, **extra}


def complete(engine, fe, b: dict) -> ChatCompletion:
    resp = engine.run(lambda: fe.create_chat_completion({**b, "stream": False}))
    assert isinstance(resp, ChatCompletion), resp
    return resp


def stream(engine, fe, b: dict) -> list[ChatCompletionChunk]:
    async def go():
        it = await fe.create_chat_completion(
            {**b, "stream": True, "stream_options": {"include_usage": True}}
        )
        return [c async for c in it]

    return engine.run(go)


def whole(resp: ChatCompletion):
    ch = resp.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in ch.message.tool_calls]
    assert all(
        c.id.startswith("chatcmpl-tool-") and c.type == "function" for c in ch.message.tool_calls
    )
    return ch.message.reasoning, ch.message.content, calls, ch.finish_reason, resp.usage


def folded(chunks: list[ChatCompletionChunk]):
    """The stream's deltas folded, checking the OpenAI stream form on the way."""
    assert all(not isinstance(c, ErrorResponse) for c in chunks), chunks
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    body_chunks = chunks[:-1]
    finishes = [c.choices[0].finish_reason for c in body_chunks]
    assert all(f is None for f in finishes[:-1]) and finishes[-1] is not None
    reasoning, content, calls = [], [], {}
    for c in body_chunks:
        d = c.choices[0].delta
        reasoning.append(d.reasoning or "")
        content.append(d.content or "")
        for tc in d.tool_calls:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function and tc.function.name
                calls[tc.index] = [tc.function.name, tc.function.arguments or ""]
            else:
                assert tc.id is None and tc.function.name is None
                calls[tc.index][1] += tc.function.arguments or ""
    return (
        "".join(reasoning) or None,
        "".join(content) or None,
        [tuple(v) for _, v in sorted(calls.items())],
        finishes[-1],
        usage,
    )


def both(engine, fe, b: dict):
    """The whole response, after checking that the stream folds into it."""
    w = whole(complete(engine, fe, b))
    assert folded(stream(engine, fe, b)) == w
    return w


def assert_valid_calls(calls, names=None):
    for name, args in calls:
        jsonschema.validate(json.loads(args), SCHEMAS[name])
        if names is not None:
            assert name in names


# ----- forced calls ---------------------------------------------------------------


def test_thinking_then_a_required_call(engine, fe):
    reasoning, content, calls, finish, usage = both(
        engine, fe, body("What is the weather in Paris?", tools=TOOLS, tool_choice="required")
    )
    assert reasoning == "The user asks about Paris. I will use a tool."
    assert content is None
    assert calls == [("get_weather", json.dumps({"city": "Paris"}))]
    assert finish == "tool_calls"
    # the thinking's tokens, the template's newlines inside the markers included
    thought = "\n" + reasoning + "\n"
    assert usage.completion_tokens_details.reasoning_tokens == len(TOK.encode(thought))


def test_the_same_with_thinking_off(engine, fe):
    b = body(
        "Quick: weather in Rome?",
        tools=TOOLS,
        tool_choice="required",
        chat_template_kwargs={"enable_thinking": False},
    )
    prepared = fe.prepare(b)
    assert prepared.engine_request.reasoning_ended is True
    assert prepared.engine_request.reasoning_parser_kwargs == {"enable_thinking": False}
    reasoning, content, calls, finish, usage = both(engine, fe, b)
    assert reasoning is None and content is None
    assert calls == [("get_weather", json.dumps({"city": "Rome"}))]
    assert finish == "tool_calls"
    assert usage.completion_tokens_details.reasoning_tokens == 0


def test_reasoning_effort_none_is_thinking_off(engine, fe):
    b = body(
        "Quick: weather in Rome?", tools=TOOLS, tool_choice="required", reasoning_effort="none"
    )
    assert fe.prepare(b).engine_request.reasoning_ended is True
    assert both(engine, fe, b)[2] == [("get_weather", json.dumps({"city": "Rome"}))]


def test_a_named_call(engine, fe):
    choice = {"type": "function", "function": {"name": "get_time"}}
    reasoning, content, calls, finish, _ = both(
        engine, fe, body("What is the time in Tokyo?", tools=TOOLS, tool_choice=choice)
    )
    assert reasoning and content is None
    assert calls == [("get_time", json.dumps({"tz": "Asia/Tokyo"}))]
    assert finish == "tool_calls"


def test_a_named_call_overrides_the_script(engine, fe):
    """The script calls get_weather; the request names get_time: the mask wins."""
    choice = {"type": "function", "function": {"name": "get_time"}}
    _, _, calls, finish, _ = both(
        engine, fe, body("What is the weather in Paris?", tools=TOOLS, tool_choice=choice)
    )
    assert [name for name, _ in calls] == ["get_time"] and finish == "tool_calls"
    assert_valid_calls(calls)


def test_parallel_calls(engine, fe):
    b = body("Both Oslo and Lima, please.", tools=TOOLS, tool_choice="required")
    calls = both(engine, fe, b)[2]
    assert calls == [
        ("get_weather", json.dumps({"city": "Oslo"})),
        ("get_weather", json.dumps({"city": "Lima"})),
    ]
    one = both(engine, fe, {**b, "parallel_tool_calls": False})
    assert one[2] == [("get_weather", json.dumps({"city": "Oslo"}))]
    assert one[3] == "tool_calls"


def test_a_call_written_while_thinking_ends_the_thinking(engine, fe):
    reasoning, content, calls, finish, usage = both(
        engine, fe, body("Call while thinking", tools=TOOLS, tool_choice="required")
    )
    assert reasoning == "I will call it right away "
    assert content is None and finish == "tool_calls"
    assert calls == [("get_weather", json.dumps({"city": "Nice"}))]
    # the opening newline is the template's layout, yet a token of the thinking
    assert usage.completion_tokens_details.reasoning_tokens == len(TOK.encode("\n" + reasoning))


def test_json_schema_way_of_forcing_calls(engine):
    """--tool-call-constraint json_schema: the call is plain JSON, whatever the script."""
    fe = engine.frontend(tool_call_parser=FORMAT, tool_call_constraint="json_schema")
    b = body("What is the weather in Paris?", tools=TOOLS, tool_choice="required")
    reasoning, content, calls, finish, _ = both(engine, fe, b)
    assert reasoning and len(calls) >= 1 and finish == "tool_calls"
    assert_valid_calls(calls)
    named = {"type": "function", "function": {"name": "get_time"}}
    calls = both(engine, fe, {**b, "tool_choice": named})[2]
    assert [n for n, _ in calls] == ["get_time"]
    assert_valid_calls(calls)


def test_a_plugin_format(engine):
    fe = engine.frontend(
        tool_call_parser="toy_calls", enable_auto_tool_choice=True, tool_parser_plugin=PLUGIN
    )
    for choice in ("auto", "required"):
        calls = both(engine, fe, body("Plugin format", tools=TOOLS, tool_choice=choice))[2]
        assert calls == [("get_time", json.dumps({"tz": "UTC"}))]


def test_a_malformed_call_is_repaired(engine, fe):
    reasoning, _, calls, finish, _ = both(
        engine, fe, body("Broken call, please.", tools=TOOLS, tool_choice="required")
    )
    assert reasoning == "The user asks about a broken call. I will use a tool."
    assert len(calls) == 1 and finish == "tool_calls"
    assert_valid_calls(calls, {"get_weather"})


def test_max_tokens_cut_gives_length(engine, fe):
    b = body("What is the weather in Paris?", tools=TOOLS, tool_choice="required", max_tokens=20)
    reasoning, _, calls, finish, usage = both(engine, fe, b)
    assert finish == "length" and usage.completion_tokens == 20
    assert reasoning.startswith("The user asks about Paris.")
    story = both(engine, fe, body("Tell a story", max_tokens=3))
    assert story[3] == "length" and story[4].completion_tokens == 3


# ----- auto, none, response formats ---------------------------------------------------


def test_auto_reads_the_calls_the_model_chose(engine, fe):
    reasoning, content, calls, finish, _ = both(engine, fe, body("Chat freely", tools=TOOLS))
    assert reasoning and content == "Let me check."  # hermes drops the space before a call
    assert calls == [("get_time", json.dumps({"tz": "UTC"}))] and finish == "tool_calls"


def test_none_leaves_calls_as_text(engine, fe):
    _, content, calls, finish, _ = both(
        engine, fe, body("Chat freely", tools=TOOLS, tool_choice="none")
    )
    assert calls == [] and finish == "stop"
    assert content == "Let me check. " + call("get_time", {"tz": "UTC"})


@pytest.mark.parametrize("thinking", [True, False])
def test_json_schema_response_format(engine, fe, thinking):
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": ANSWER_SCHEMA}}
    b = body("JSON answer, please", response_format=fmt)
    if not thinking:
        b["chat_template_kwargs"] = {"enable_thinking": False}
    reasoning, content, calls, finish, _ = both(engine, fe, b)
    jsonschema.validate(json.loads(content), ANSWER_SCHEMA)  # in content, never in reasoning
    assert finish == "stop" and not calls
    if thinking:
        assert reasoning == "I know this one."
        assert json.loads(content) == {"city": "Paris", "temp_c": 21}
    else:
        assert reasoning is None


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"response_format": {"type": "json_object"}}, lambda c: isinstance(json.loads(c), dict)),
        (
            {"structured_outputs": {"regex": "(yes|no), [a-z ]{1,12}\\."}},
            lambda c: re.fullmatch(r"(yes|no), [a-z ]{1,12}\.", c),
        ),
        ({"structured_outputs": {"choice": ["sunny", "rainy"]}}, lambda c: c in ("sunny", "rainy")),
        ({"structured_outputs": {"json": ANSWER_SCHEMA}}, lambda c: json.loads(c)["temp_c"] == 21),
        (
            {
                "response_format": {
                    "type": "structural_tag",
                    "format": {"type": "const_string", "value": "Fixed answer."},
                }
            },
            lambda c: c == "Fixed answer.",
        ),
        (
            {
                "response_format": {
                    "type": "structural_tag",
                    "structures": [{"begin": "<a>", "schema": ANSWER_SCHEMA, "end": "</a>"}],
                    "triggers": ["<a>"],
                }
            },
            lambda c: json.loads(c)["city"] == "Paris",  # no trigger: the text is free
        ),
    ],
)
def test_other_constraints(engine, fe, extra, check):
    reasoning, content, calls, finish, _ = both(engine, fe, body("JSON answer", **extra))
    assert reasoning == "I know this one." and not calls and finish == "stop"
    assert check(content), content


def test_include_reasoning_false_drops_reasoning_only(engine, fe):
    b = body("What is the weather in Paris?", tools=TOOLS, tool_choice="required")
    shown = both(engine, fe, b)
    hidden = both(engine, fe, {**b, "include_reasoning": False})
    assert shown[0] and hidden[0] is None
    assert hidden[1:] == shown[1:]  # content, calls, finish reason, usage
    assert fe.prepare({**b, "include_reasoning": False}).engine_request.reasoning_ended is False


def test_stop_strings_cut_the_text(engine, fe):
    reasoning, content, _, finish, _ = both(engine, fe, body("Tell a story", stop=[" STOP", "zzz"]))
    assert reasoning == "A short story."
    assert content == "Once upon a time a" and finish == "stop"


def test_usage_matches_the_engine(engine, fe):
    b = body("What is the weather in Paris?", tools=TOOLS, tool_choice="required")
    prepared = fe.prepare(b)

    async def raw():
        outs = [o async for o in engine.client.generate(prepared.engine_request)]
        return sum(len(o.new_token_ids) for o in outs), outs[-1]

    n, last = engine.run(raw)
    usage = whole(complete(engine, fe, b))[4]
    assert last.finish_reason == FinishReason.STOP
    assert usage.completion_tokens == n
    assert usage.completion_tokens_details.reasoning_tokens == last.num_reasoning_tokens
    assert usage.prompt_tokens == len(prepared.prompt_token_ids)


def test_continuous_usage_stats(engine, fe):
    b = body("Tell a story", stream=True)
    b["stream_options"] = {"continuous_usage_stats": True}

    async def go():
        return [c async for c in await fe.create_chat_completion(b)]

    chunks = engine.run(go)
    used = [c.usage.completion_tokens for c in chunks]
    assert used == sorted(used) and used[0] == 0
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_closing_a_stream_early_aborts_the_request(engine, fe):
    prepared = fe.prepare(body("Tell a story", ignore_eos=True, max_tokens=2000, stream=True))

    async def go():
        it = fe.stream(prepared)
        [await anext(it) for _ in range(3)]
        await it.aclose()
        for _ in range(50):
            health = await engine.client.health()
            if health.num_running == 0:
                break
            await asyncio.sleep(0.05)
        return health

    assert engine.run(go).num_running == 0


# ----- errors ---------------------------------------------------------------------------


def test_engine_errors_become_error_responses(engine, fe):
    bad = {"regex": "(x"}  # only the engine's compiler reads regexes
    resp = engine.run(lambda: fe.create_chat_completion(body("answer", structured_outputs=bad)))
    assert isinstance(resp, ErrorResponse) and resp.error.code == 400
    assert "regex" in resp.error.message
    chunks = stream(engine, fe, body("answer", structured_outputs=bad))
    assert isinstance(chunks[-1], ErrorResponse)


def test_schemas_the_engine_would_refuse_are_refused_before_it(engine, fe):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    for stream_it in (False, True):
        b = body("JSON answer", response_format=bad, stream=stream_it)
        resp = engine.run(lambda b=b: fe.create_chat_completion(b))
        assert isinstance(resp, ErrorResponse) and resp.error.code == 400
        assert resp.error.param == "response_format"
        assert "unknown type 'nonsense'" in resp.error.message


def test_ignored_keywords_are_stated_in_the_response(engine, fe):
    """A keyword the grammar cannot enforce is refused, naming it; on request it is
    left out, and both the whole response and the stream's first chunk say so."""
    schema = {**ANSWER_SCHEMA, "not": {"required": ["wind"]}}
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    b = body("JSON answer", response_format=fmt)
    resp = engine.run(lambda: fe.create_chat_completion(b))
    assert isinstance(resp, ErrorResponse) and resp.error.code == 400
    assert resp.error.param == "response_format" and "not" in resp.error.message
    b = {**b, "ignore_unsupported_keywords": True}
    resp = complete(engine, fe, b)
    assert resp.ignored_keywords and resp.ignored_keywords[0].startswith("not")
    assert json.loads(resp.choices[0].message.content) == {"city": "Paris", "temp_c": 21}
    chunks = stream(engine, fe, b)
    assert chunks[0].ignored_keywords == resp.ignored_keywords
    assert all(c.ignored_keywords is None for c in chunks[1:])
    plain = complete(engine, fe, body("JSON answer", response_format={"type": "json_object"}))
    assert plain.ignored_keywords is None
    assert b"ignored_keywords" not in msgspec.json.encode(plain)  # absent, not null


def test_bad_requests_never_reach_the_engine(engine, fe):
    resp = engine.run(lambda: fe.create_chat_completion(body("hi", tool_choice="required")))
    assert isinstance(resp, ErrorResponse) and resp.error.param == "tool_choice"
    resp = engine.run(lambda: fe.create_chat_completion(body("hi", model="gpt-9")))
    assert resp.error.code == 404 and "gpt-9" in resp.error.message
    with pytest.raises(RequestError, match="thinking_token_budget"):
        engine.frontend().prepare(body("hi", thinking_token_budget=-3))


def test_thinking_budget_reaches_the_engine(engine, fe):
    b = body(
        "What is the weather in Paris?",
        tools=TOOLS,
        tool_choice="required",
        thinking_token_budget=3,
    )
    assert fe.prepare(b).engine_request.reasoning_budget == 3
    reasoning, _, calls, finish, usage = both(engine, fe, b)
    assert usage.completion_tokens_details.reasoning_tokens == 3
    assert len(calls) >= 1 and finish == "tool_calls"
    assert_valid_calls(calls)


# ----- flags -----------------------------------------------------------------------------


def test_auto_needs_enable_auto_tool_choice(engine):
    fe = engine.frontend(tool_call_parser=FORMAT)
    resp = engine.run(lambda: fe.create_chat_completion(body("Chat freely", tools=TOOLS)))
    assert isinstance(resp, ErrorResponse)
    assert "--enable-auto-tool-choice" in resp.error.message
    # forced calls still use the format
    calls = whole(
        complete(engine, fe, body("weather in Paris", tools=TOOLS, tool_choice="required"))
    )[2]
    assert calls == [("get_weather", json.dumps({"city": "Paris"}))]


def test_flag_errors(engine):
    with pytest.raises(ConfigError, match="requires --tool-call-parser"):
        engine.frontend(enable_auto_tool_choice=True)
    with pytest.raises(ConfigError, match="unknown tool-call parser 'nope'; known: .*hermes"):
        engine.frontend(tool_call_parser="nope", enable_auto_tool_choice=True)
    with pytest.raises(ConfigError, match="--tool-parser-plugin"):
        engine.frontend(tool_parser_plugin="no_such_module_anywhere")
    with pytest.raises(ConfigError, match="differs from the engine's"):
        engine.frontend(reasoning_parser="deepseek_r1")
    with pytest.raises(ConfigError, match="unknown reasoning parser 'nope'; known: .*qwen3"):
        engine.frontend(reasoning_parser="nope")
    with pytest.raises(ConfigError, match="--reasoning-parser-plugin"):
        engine.frontend(reasoning_parser_plugin="/no/such/plugin.py")
    with pytest.raises(ConfigError, match="--chat-template"):
        engine.frontend(chat_template="missing.jinja")


def test_without_a_format_calls_are_forced_as_json(engine):
    """vLLM's rule: no --tool-call-parser, forced calls come as plain JSON; "auto" is
    refused."""
    fe = engine.frontend()
    b = body("What is the weather in Paris?", tools=TOOLS, tool_choice="required")
    reasoning, _, calls, finish, _ = both(engine, fe, b)
    assert reasoning and len(calls) >= 1 and finish == "tool_calls"
    assert_valid_calls(calls)
    resp = engine.run(lambda: fe.create_chat_completion({**b, "tool_choice": "auto"}))
    assert isinstance(resp, ErrorResponse) and "--tool-call-parser" in resp.error.message
