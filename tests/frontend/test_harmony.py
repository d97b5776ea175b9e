"""Harmony (gpt-oss) end to end: the o200k_harmony vocabulary, the built-in Harmony
template, the openai_gptoss reasoning parser and the openai tool format, with the
scripted model. The answer lives in a final-channel message, a call in a commentary
message to ``functions.NAME``; the front end returns neither header."""

from __future__ import annotations

import json

import jsonschema
import pytest

from .test_integration import both

ANALYSIS = "<|channel|>analysis<|message|>{}<|end|><|start|>assistant"
RULES = [
    {
        "match": "weather in Paris",
        "output": ANALYSIS.format("Need the weather tool.")
        + "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        + '{"city": "Paris"}<|call|>',
    },
    {
        "match": "forecast as JSON",
        "output": ANALYSIS.format("A JSON object.")
        + '<|channel|>final<|message|>{"city": "Oslo", "temp_c": 4}<|return|>',
    },
    {
        "match": "Say hello",
        "output": ANALYSIS.format("Greet back.") + "<|channel|>final<|message|>Hello!<|return|>",
    },
]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
ANSWER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}},
    "required": ["city", "temp_c"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(engine_factory):
    return engine_factory(RULES, tokenizer="o200k_harmony", reasoning_parser="openai_gptoss")


@pytest.fixture(scope="module")
def fe(engine):
    return engine.frontend(tool_call_parser="openai", enable_auto_tool_choice=True)


def body(text: str, **extra) -> dict:
    kwargs = {"current_date": "2026-01-02"}
    return {"messages": [{"role": "user", "content": text}], "seed": 3,
            "chat_template_kwargs": kwargs, **extra}  # fmt: skip


def test_the_prompt_ends_with_the_assistant_start(fe):
    prepared = fe.prepare(body("Say hello", tools=TOOLS, reasoning_effort="high"))
    assert prepared.prompt_text.endswith(
        "<|start|>user<|message|>Say hello<|end|><|start|>assistant"
    )
    assert (
        "Reasoning: high" in prepared.prompt_text
        and "namespace functions {" in prepared.prompt_text
    )
    assert prepared.engine_request.reasoning_ended is False


def test_a_plain_answer(engine, fe):
    reasoning, content, calls, finish, usage = both(engine, fe, body("Say hello"))
    assert (reasoning, content, calls, finish) == ("Greet back.", "Hello!", [], "stop")
    assert usage.completion_tokens_details.reasoning_tokens > 0


def test_a_forced_call(engine, fe):
    reasoning, content, calls, finish, _ = both(
        engine, fe, body("What is the weather in Paris?", tools=TOOLS, tool_choice="required")
    )
    assert reasoning == "Need the weather tool." and content is None
    assert [(n, json.loads(a)) for n, a in calls] == [("get_weather", {"city": "Paris"})]
    assert finish == "tool_calls"


def test_a_json_answer_in_the_final_channel(engine, fe):
    fmt = {"type": "json_schema", "json_schema": {"name": "f", "schema": ANSWER}}
    reasoning, content, calls, finish, _ = both(
        engine, fe, body("forecast as JSON", response_format=fmt)
    )
    assert reasoning == "A JSON object." and not calls and finish == "stop"
    jsonschema.validate(json.loads(content), ANSWER)
    assert json.loads(content) == {"city": "Oslo", "temp_c": 4}
