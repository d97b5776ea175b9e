"""The API's request rules: each one refuses with a message and the offending parameter."""

from __future__ import annotations

import json

import pytest

from frontend.protocol import ChatCompletionRequest
from frontend.validation import RequestError, ToolSupport, check_request, decode_request

FULL = ToolSupport(auto=True, forced=True)
USER = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]


def plan_of(body: dict, support: ToolSupport = FULL):
    return check_request(decode_request(body), support)


def refused(body: dict | bytes, support: ToolSupport = FULL) -> RequestError:
    with pytest.raises(RequestError) as info:
        req = decode_request(body)
        check_request(req, support)
    err = info.value
    assert err.status_code == 400 and err.message
    return err


# ----- tool_choice -------------------------------------------------------------------


def test_tools_without_tool_choice_mean_auto():
    plan = plan_of({"messages": USER, "tools": TOOLS})
    assert plan.mode == "auto" and plan.reads_calls and not plan.forced
    assert [t.name for t in plan.tools] == ["get_weather", "get_time"]


def test_no_tools_mean_none():
    plan = plan_of({"messages": USER})
    assert plan.mode == "none" and not plan.reads_calls


def test_none_means_no_calls_even_with_tools():
    plan = plan_of({"messages": USER, "tools": TOOLS, "tool_choice": "none"})
    assert plan.mode == "none" and not plan.reads_calls and not plan.forced


def test_required_and_named():
    assert plan_of({"messages": USER, "tools": TOOLS, "tool_choice": "required"}).forced
    named = {"type": "function", "function": {"name": "get_time"}}
    plan = plan_of({"messages": USER, "tools": TOOLS, "tool_choice": named})
    assert plan.mode == "named" and plan.named == "get_time" and plan.forced


def test_parallel_tool_calls_reaches_the_plan():
    body = {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
    assert plan_of(body).parallel
    assert not plan_of({**body, "parallel_tool_calls": False}).parallel


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_forced_choice_without_tools_is_refused(choice):
    err = refused({"messages": USER, "tool_choice": choice})
    assert err.param == "tool_choice" and "needs tools" in err.message


def test_named_function_must_be_a_tool():
    choice = {"type": "function", "function": {"name": "get_stock"}}
    err = refused({"messages": USER, "tools": TOOLS, "tool_choice": choice})
    assert err.param == "tool_choice"
    assert "'get_stock'" in err.message and "'get_weather'" in err.message


def test_auto_needs_the_server_flags():
    support = ToolSupport(auto=False, forced=True)
    err = refused({"messages": USER, "tools": TOOLS}, support)
    assert err.param == "tool_choice" and "--enable-auto-tool-choice" in err.message
    # "none" and forced calls still work without them
    assert plan_of({"messages": USER, "tools": TOOLS, "tool_choice": "none"}, support)
    assert plan_of({"messages": USER, "tools": TOOLS, "tool_choice": "required"}, support)


def test_forced_needs_a_way_to_force():
    err = refused(
        {"messages": USER, "tools": TOOLS, "tool_choice": "required"},
        ToolSupport(auto=False, forced=False),
    )
    assert "--tool-call-parser" in err.message


def test_unknown_tool_choice_string():
    err = refused({"messages": USER, "tools": TOOLS, "tool_choice": "always"})
    assert err.param == "tool_choice" and "'always'" in err.message


def test_tool_names_follow_openai_rules():
    bad = [{"type": "function", "function": {"name": "get weather"}}]
    err = refused({"messages": USER, "tools": bad})
    assert err.param == "tools[0].function.name"
    dup = [TOOLS[1], TOOLS[1]]
    assert "two tools" in refused({"messages": USER, "tools": dup}).message


def test_forced_call_and_response_format_conflict():
    body = {
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": "required",
        "response_format": {"type": "json_object"},
    }
    assert refused(body).param == "response_format"
    # a text response format is no constraint
    assert plan_of({**body, "response_format": {"type": "text"}}).forced


# ----- decoding: unknown fields and wrong types ----------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": USER, "max_token": 5}, "max_token", "unknown field"),
        ({"messages": [{"role": "user", "content": "x", "foo": 1}]}, "messages[0].foo", "unknown"),
        ({"messages": USER, "max_tokens": "5"}, "max_tokens", "Expected `int"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "'bot'"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "missing"),
        ({}, "messages", "missing required field"),
        (
            {"messages": USER, "response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "missing",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
            "'image_url'",
        ),
    ],
)
def test_decode_errors_name_the_field(body, param, words):
    err = refused(body)
    assert err.param == param
    assert words in err.message


def test_malformed_json_is_refused():
    err = refused(b'{"messages": [')
    assert "not valid JSON" in err.message


def test_bytes_and_mappings_decode_alike():
    body = {"messages": USER, "tools": TOOLS, "tool_choice": "required", "temperature": 0}
    a = decode_request(json.dumps(body).encode())
    b = decode_request(body)
    assert isinstance(a, ChatCompletionRequest) and a == b


# ----- sampling and other fields ------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"echo": True}, "echo"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"thinking_token_budget": -1}, "thinking_token_budget"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}},
            "structured_outputs",
        ),
        ({"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs"),
    ],
)
def test_bad_values_are_refused(extra, param):
    assert refused({"messages": USER, **extra}).param == param


def test_error_response_shape():
    err = refused({"messages": USER, "n": 3})
    resp = err.to_response()
    assert resp.error.code == 400 and resp.error.param == "n"
    assert resp.error.type == "BadRequestError"
