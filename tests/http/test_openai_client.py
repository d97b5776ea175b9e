"""``thinkgate serve`` driven by the official ``openai`` client, sync and async.

One server process for the module: the scripted model on the bundled Qwen3
vocabulary, the qwen3 reasoning parser, hermes tool calls with "auto" allowed, an API
key from the environment. The scripted model writes its script wherever the grammar
allows it; where it does not (a forced call the script does not make), the mask
decides. The last test kills the engine under the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.http_server import Server
from tests.support.weather import SCHEMAS, TOOLS, call

KEY = "test-key-123"
MODEL = "thinkgate-test"


def think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


FORECAST = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "high_c": {"type": "integer"}},
    "required": ["city", "high_c"],
    "additionalProperties": False,
}
STORY = "Once upon a time a STOP sign fell over. 東京🦜 was calm. The end."
RULES = [
    {
        "match": "weather in Paris",
        "output": think("Paris: a tool.") + call("get_weather", {"city": "Paris"}),
    },
    {
        "match": "Oslo and Lima",
        "output": think("Two cities.")
        + call("get_weather", {"city": "Oslo"})
        + "\n"
        + call("get_weather", {"city": "Lima"}),
    },
    {
        "match": "umbrella in London",
        "output": think("Check first.")
        + "Let me check. "
        + call("get_weather", {"city": "London"}),
    },
    {
        "match": "forecast as JSON",
        "output": think("A small object.") + '{"city": "Rome", "high_c": 24}',
    },
    {"match": "Tell a story", "output": think("A short story.") + STORY},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    script = tmp_path_factory.mktemp("http") / "script.json"
    script.write_text(json.dumps({"rules": RULES, "default": "Nothing is scripted."}))
    s = Server(
        [
            "--model", "scripted", "--script", str(script), "--tokenizer", "qwen3",
            "--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", "--device", "cpu", "--compile-workers", "0",
            "--compile-timeout-s", "60",
            "--served-model-name", MODEL,
        ],
        env={"THINKGATE_API_KEY": KEY},
    )  # fmt: skip
    yield s
    assert s.stop() == 0, s.output


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0) as c:
        yield c


def ask(client, text: str, **kw):
    kw.setdefault("seed", 3)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], **kw
    )


def calls_of(message) -> list[tuple[str, dict]]:
    out = []
    for c in message.tool_calls or []:
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        assert c.id and c.type == "function"
        out.append((c.function.name, args))
    return out


# ----- tool choices ---------------------------------------------------------------------


def test_required_call(client):
    r = ask(client, "What is the weather in Paris?", tools=TOOLS, tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert calls_of(choice.message) == [("get_weather", {"city": "Paris"})]
    assert choice.message.reasoning == "Paris: a tool."
    assert r.model == MODEL and r.usage.completion_tokens_details.reasoning_tokens > 0


def test_named_call_overrides_what_the_model_wanted(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    r = ask(client, "What is the weather in Paris?", tools=TOOLS, tool_choice=named)
    calls = calls_of(r.choices[0].message)
    assert [name for name, _ in calls] == ["get_time"]
    assert r.choices[0].finish_reason == "tool_calls"


def test_auto_reads_content_and_calls(client):
    r = ask(client, "Do I need an umbrella in London?", tools=TOOLS, tool_choice="auto")
    m = r.choices[0].message
    assert m.content == "Let me check."
    assert calls_of(m) == [("get_weather", {"city": "London"})]


def test_none_reads_no_calls(client):
    r = ask(client, "What is the weather in Paris?", tools=TOOLS, tool_choice="none")
    m = r.choices[0].message
    assert not m.tool_calls and r.choices[0].finish_reason == "stop"
    assert m.content == call("get_weather", {"city": "Paris"})


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_calls_on_and_off(client, parallel):
    r = ask(
        client, "Weather in Oslo and Lima?", tools=TOOLS, tool_choice="required",
        parallel_tool_calls=parallel,
    )  # fmt: skip
    calls = calls_of(r.choices[0].message)
    if parallel:
        assert calls == [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Lima"})]
    else:
        assert len(calls) == 1 and calls[0][0] == "get_weather"


def test_response_format_json_schema(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": FORECAST}}
    r = ask(client, "Tomorrow's forecast as JSON", response_format=fmt)
    m = r.choices[0].message
    assert json.loads(m.content) == {"city": "Rome", "high_c": 24}
    assert m.reasoning == "A small object."
    # a request the script does not cover: the mask alone makes it valid
    r = ask(client, "Anything at all", response_format=fmt, max_tokens=300)
    if r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(r.choices[0].message.content), FORECAST)


# ----- streams -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "choice"),
    [("Weather in Oslo and Lima?", "required"), ("Do I need an umbrella in London?", "auto")],
)
def test_streamed_tool_calls_reassembled_by_the_client(client, text, choice):
    whole = ask(client, text, tools=TOOLS, tool_choice=choice)
    with client.chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        tools=TOOLS,
        tool_choice=choice,
        seed=3,
        stream_options={"include_usage": True},
    ) as stream:
        kinds = [type(event).__name__ for event in stream]
        final = stream.get_final_completion()
    pieces = kinds.count("FunctionToolCallArgumentsDeltaEvent")
    w, s = whole.choices[0], final.choices[0]
    # a forced call streams its arguments as they are written; "auto" holds each call
    # until it is known to be one, and sends it in one piece
    if choice == "required":
        assert pieces > 2 * len(s.message.tool_calls), kinds
    else:
        assert pieces == len(s.message.tool_calls) > 0, kinds
    assert calls_of(s.message) == calls_of(w.message)
    assert s.message.content == w.message.content and s.finish_reason == w.finish_reason
    assert final.usage is not None and final.usage.total_tokens == whole.usage.total_tokens


def test_stream_ends_with_done_and_a_usage_chunk(server):
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "Tell a story"}],
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    with httpx.stream(
        "POST", server.base_url + "/chat/completions", json=body,
        headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
    ) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in map(json.loads, events[:-2])
    )
    assert text == STORY


def test_stop_strings_cut_the_same_text_whole_and_streamed(client):
    for stop in (["STOP"], ["🦜 was", "never"], ["京🦜"]):
        whole = ask(client, "Tell a story", stop=stop).choices[0]
        pieces = []
        finish = None
        for chunk in ask(client, "Tell a story", stop=stop, stream=True):
            for ch in chunk.choices:
                pieces.append(ch.delta.content or "")
                finish = ch.finish_reason or finish
        cut = min(STORY.index(s) for s in stop if s in STORY)
        assert whole.message.content == "".join(pieces) == STORY[:cut]
        assert whole.finish_reason == finish == "stop"
        assert whole.stop_reason in stop


def test_include_reasoning_false_hides_the_thinking_and_its_logprobs(client):
    kw = dict(logprobs=True, top_logprobs=2, seed=5)
    shown = ask(client, "Tell a story", **kw).choices[0]
    hidden = ask(client, "Tell a story", extra_body={"include_reasoning": False}, **kw).choices[0]
    assert shown.message.reasoning == "A short story." and hidden.message.reasoning is None
    assert shown.message.content == hidden.message.content == STORY
    every = b"".join(bytes(t.bytes) for t in shown.logprobs.content).decode()
    answer = b"".join(bytes(t.bytes) for t in hidden.logprobs.content).decode()
    assert every.startswith("<think>") and "A short story." in every
    assert "short story" not in answer and "<think>" not in answer and answer.endswith(STORY)
    for t in shown.logprobs.content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    # streamed, the same tokens
    streamed = []
    for chunk in ask(
        client, "Tell a story", stream=True, extra_body={"include_reasoning": False}, **kw
    ):
        for ch in chunk.choices:
            assert getattr(ch.delta, "reasoning", None) is None
            if ch.logprobs is not None:
                streamed += [bytes(t.bytes) for t in ch.logprobs.content]
    assert b"".join(streamed).decode() == answer


def test_greedy_tokens_are_the_likeliest(client):
    r = ask(client, "Tell a story", logprobs=True, top_logprobs=3, temperature=0).choices[0]
    assert r.message.content == STORY
    for t in r.logprobs.content:
        best = t.top_logprobs[0]
        assert (best.token, best.bytes) == (t.token, t.bytes) and best.logprob == t.logprob
        assert [x.logprob for x in t.top_logprobs] == sorted(
            (x.logprob for x in t.top_logprobs), reverse=True
        )


def test_async_client_concurrent_streams(server):
    async def one(c: openai.AsyncOpenAI, i: int) -> str:
        stream = await c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell a story"}],
            stream=True,
            seed=i,
        )
        return "".join([ch.delta.content or "" async for chunk in stream for ch in chunk.choices])

    async def main() -> list[str]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0) as c:
            return await asyncio.gather(*(one(c, i) for i in range(12)))

    assert asyncio.run(main()) == [STORY] * 12


def test_completions_endpoint(client):
    r = client.completions.create(model=MODEL, prompt="Tell a story", max_tokens=5, seed=1)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    # the raw text, thinking markers and all
    whole = client.completions.create(model=MODEL, prompt="Tell a story", max_tokens=100)
    assert whole.choices[0].text == think("A short story.") + STORY
    # streamed, with a stop string: the same text up to it
    pieces, finish = [], None
    for chunk in client.completions.create(
        model=MODEL, prompt="Tell a story", max_tokens=100, stop=["🦜"], stream=True
    ):
        for ch in chunk.choices:
            pieces.append(ch.text)
            finish = ch.finish_reason or finish
    text = think("A short story.") + STORY
    assert "".join(pieces) == text[: text.index("🦜")] and finish == "stop"
    # a raw prompt with a JSON-schema constraint (and log-probabilities)
    r = client.completions.create(
        model=MODEL, prompt="<|im_start|>assistant\n<think>\n\n</think>\n\n", max_tokens=200,
        logprobs=1, seed=2,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {
            "name": "f", "schema": FORECAST}}},
    )  # fmt: skip
    c = r.choices[0]
    if c.finish_reason == "stop":  # the prompt closed the thinking: all of it is JSON
        jsonschema.validate(json.loads(c.text), FORECAST)
    assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == len(c.logprobs.text_offset)


def test_models_and_metrics(client, server):
    assert [m.id for m in client.models.list()] == [MODEL]
    ask(client, "What is the weather in Paris?", tools=TOOLS, tool_choice="required")
    text = httpx.get(server.url + "/metrics", timeout=30).text
    for name in (
        "thinkgate_requests_total",
        "thinkgate_requests_running",
        "thinkgate_requests_waiting",
        "thinkgate_generation_tokens_total",
        "thinkgate_reasoning_tokens_total",
        "thinkgate_grammar_compile_seconds_count",
        "thinkgate_grammar_cache_hits_total",
        "thinkgate_fill_seconds_sum",
    ):
        assert name in text, name
    assert 'finish_reason="tool_calls"' in text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["thinkgate_grammar_compile_seconds_count"] >= 1
    assert values["thinkgate_fill_seconds_count"] >= 1 and values["thinkgate_engine_up"] == 1


# ----- errors --------------------------------------------------------------------------


def test_bad_requests_are_400_with_the_openai_body(client, server):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.base_url + "/chat/completions", content=b"{nope", headers=auth)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    cases = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}},
         None),
        ({"frobnicate": 1}, "frobnicate"),
        ({"n": 2}, "n"),
        ({"temperature": "hot"}, "temperature"),
        ({"messages": []}, "messages"),
    ]  # fmt: skip
    for extra, param in cases:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
        r = httpx.post(server.base_url + "/chat/completions", json=body, headers=auth, timeout=60)
        assert r.status_code == 400, (extra, r.text)
        err = r.json()["error"]
        assert err["code"] == 400 and err["message"] and err["type"] == "BadRequestError"
        if param:
            assert err["param"] == param, err
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "hi", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "x"}})
    assert "not among the tools" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = [
    "messages", "tools", "tool_choice", "response_format", "stop", "max_tokens", "n", "seed",
    "temperature", "top_p", "top_k", "logprobs", "top_logprobs", "stream", "stream_options",
    "chat_template_kwargs", "include_reasoning", "structured_outputs", "min_tokens",
    "parallel_tool_calls", "reasoning_effort", "thinking_token_budget", "stop_token_ids",
]  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutations=st.dictionaries(st.sampled_from(FIELDS), JSON, min_size=1, max_size=3))
def test_no_request_makes_a_500(server, mutations):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        **mutations,
    }
    r = httpx.post(
        server.base_url + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    )
    assert r.status_code in (200, 400, 404), (body, r.status_code, r.text)
    if r.status_code != 200:
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"]


def test_earlier_thinking_in_either_field(client):
    for field in ("reasoning", "reasoning_content"):
        history = [
            {"role": "user", "content": "Tell a story"},
            {"role": "assistant", "content": "Once.", field: "I thought."},
            {"role": "user", "content": "Tell a story again"},
        ]
        r = client.chat.completions.create(model=MODEL, messages=history, seed=1)
        assert r.choices[0].message.content == STORY


def test_api_key_refusal(server):
    for key in ("wrong", ""):
        with openai.OpenAI(base_url=server.base_url, api_key=key or "x", max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError):
                c.models.list()
    r = httpx.get(server.base_url + "/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == 401
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def _running(server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("thinkgate_requests_running "):
            return float(line.split()[1])
    raise AssertionError(text)


def test_disconnect_mid_stream_aborts_in_the_engine(client, server):
    stream = ask(
        client, "Tell a story", stream=True, max_tokens=30000, extra_body={"ignore_eos": True}
    )
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got >= 5:
            break
    assert _running(server) >= 1
    stream.close()
    deadline = time.monotonic() + 30
    while _running(server) > 0:
        assert time.monotonic() < deadline, "the request still runs in the engine"
        time.sleep(0.2)
    text = httpx.get(server.url + "/metrics", timeout=30).text
    assert 'finish_reason="disconnected"' in text


def test_a_dead_engine_is_503(client, server):
    """Last: the engine is killed under the server."""
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    os.kill(server.engine_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while httpx.get(server.url + "/health", timeout=30).status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with pytest.raises(openai.InternalServerError) as e:
        ask(client, "What is the weather in Paris?")
    assert e.value.status_code == 503 and "engine is gone" in str(e.value)
