"""Chat templates: the built-in Qwen3 and Harmony renderings, templates from a model
directory, and prompts that round-trip through the tokenizer with single-id markers."""

from __future__ import annotations

import json

import pytest

from frontend.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    builtin_template,
    resolve_chat_template,
    template_messages,
    template_tools,
)
from frontend.request_builder import template_kwargs
from frontend.validation import decode_request
from reasoning import create_reasoning_parser
from tokenization import load_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        },
    },
}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning": "I should look it up.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
]


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def harmony():
    return load_tokenizer("o200k_harmony")


def render(name: str, body: dict) -> str:
    req = decode_request(body)
    template = ChatTemplate(builtin_template(name))
    return template.render(
        template_messages(req.messages), template_tools(req.tools), kwargs=template_kwargs(req)
    )


def assert_round_trip(tokenizer, text: str, markers: list[str]) -> list[int]:
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    for m in markers:
        tid = tokenizer.special_tokens[m]
        assert ids.count(tid) == text.count(m) > 0, m
    return ids


# ----- Qwen3 ------------------------------------------------------------------------


def test_qwen3_plain(qwen3):
    text = render(
        "qwen3",
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ]
        },
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert_round_trip(qwen3, text, ["<|im_start|>", "<|im_end|>"])


def test_qwen3_tools_in_the_system_prompt(qwen3):
    text = render(
        "qwen3",
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
            "tools": [WEATHER],
        },
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert "\n<tools>\n" + json.dumps(WEATHER) + "\n</tools>\n" in text
    assert (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        in text
    )
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert_round_trip(qwen3, text, ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"])


@pytest.mark.parametrize(
    "extra",
    [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}],
)
def test_qwen3_thinking_off(qwen3, extra):
    body = {"messages": [{"role": "user", "content": "Hi"}], **extra}
    text = render("qwen3", body)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = assert_round_trip(qwen3, text, ["<think>", "</think>"])
    kwargs = template_kwargs(decode_request(body))
    assert create_reasoning_parser("qwen3", qwen3, kwargs).reasoning_ended(ids)


def test_qwen3_thinking_on_leaves_the_thinking_to_the_model(qwen3):
    body = {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {}}
    ids = qwen3.encode(render("qwen3", body))
    assert not create_reasoning_parser("qwen3", qwen3, {}).reasoning_ended(ids)


def test_qwen3_history_with_tool_calls(qwen3):
    messages = [*HISTORY, {"role": "assistant", "content": "21 degrees."}]
    messages += [{"role": "user", "content": "And Rome?"}]
    text = render("qwen3", {"messages": messages, "tools": [WEATHER]})
    tail = text[text.index("<|im_start|>user\nWeather in Paris?") :]
    # Thinking before the last real query is dropped; calls and results stay.
    assert tail == (
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n21 degrees.<|im_end|>\n"
        "<|im_start|>user\nAnd Rome?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert_round_trip(
        qwen3,
        text,
        ["<|im_start|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
    )


def test_qwen3_keeps_the_thinking_of_the_current_turn(qwen3):
    text = render("qwen3", {"messages": HISTORY, "tools": [WEATHER]})
    assert text.endswith(
        "<|im_start|>assistant\n<think>\nI should look it up.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    # reasoning_content (the older field) renders the same
    old = [dict(m) for m in HISTORY]
    old[2]["reasoning_content"] = old[2].pop("reasoning")
    assert render("qwen3", {"messages": old, "tools": [WEATHER]}) == text


def test_qwen3_parallel_calls_and_text_parts():
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Paris "}, {"type": "text", "text": "and Rome"}],
        },
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {"id": "a", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "b", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "21"},
        {"role": "tool", "tool_call_id": "b", "content": "25"},
    ]
    text = render("qwen3", {"messages": messages})
    assert "<|im_start|>user\nParis and Rome<|im_end|>" in text
    assert (
        "Checking both.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\n21\n</tool_response>\n"
        "<tool_response>\n25\n</tool_response><|im_end|>\n"
    ) in text


# ----- Harmony -----------------------------------------------------------------------


def test_harmony(harmony):
    body = {
        "messages": [*HISTORY],
        "tools": [WEATHER],
        "reasoning_effort": "high",
        "chat_template_kwargs": {"current_date": "2026-01-02"},
    }
    text = render("harmony", body)
    assert text == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2026-01-02\n\nReasoning: high\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n"
        "## functions\n\nnamespace functions {\n\n"
        "// Current weather of a city\ntype get_weather = (_: {\n"
        "// City name\ncity: string,\n"
        'unit?: "c" | "f", // default: "c"\n'
        "days?: number,\n"
        "}) => any;\n\n} // namespace functions<|end|>"
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>I should look it up.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
        '{"temp": 21}<|end|>'
        "<|start|>assistant"
    )
    markers = ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|call|>"]
    assert_round_trip(harmony, text, markers)


def test_harmony_defaults_and_final_answers(harmony):
    messages = [*HISTORY[1:], {"role": "assistant", "content": "21 degrees."}]
    messages += [{"role": "user", "content": "Thanks"}]
    text = render("harmony", {"messages": messages, "reasoning_effort": "none"})
    assert "Reasoning: low\n\n" in text  # Harmony's least effort
    assert "<|start|>developer" not in text  # no instructions, no tools
    assert "<|channel|>analysis" not in text  # a final answer followed the call
    assert "<|start|>assistant<|channel|>final<|message|>21 degrees.<|end|>" in text
    assert text.endswith("<|start|>user<|message|>Thanks<|end|><|start|>assistant")
    assert_round_trip(harmony, text, ["<|start|>", "<|channel|>", "<|call|>"])


# ----- where templates come from -----------------------------------------------------


def test_builtin_templates_for_the_bundled_vocabularies():
    assert resolve_chat_template(None, None, "qwen3") == builtin_template("qwen3")
    assert resolve_chat_template(None, None, "o200k_harmony") == builtin_template("harmony")
    assert resolve_chat_template("harmony", "{{ x }}", "qwen3") == builtin_template("harmony")
    with pytest.raises(ChatTemplateError, match="--chat-template"):
        resolve_chat_template(None, None, "cl100k_base")
    with pytest.raises(ChatTemplateError, match="neither a file nor a built-in"):
        resolve_chat_template("nope", None, "qwen3")


def test_template_file_option(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    source = resolve_chat_template(str(f), None, "qwen3")
    assert ChatTemplate(source).render([{"role": "user", "content": "x"}]) == "[user]x"


@pytest.mark.parametrize("as_list", [False, True])
def test_template_from_a_model_directory(tmp_path, as_list):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "<s>": 3, "</s>": 4}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["<s>", "</s>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    source = "{{ bos_token }}{% for m in messages %}{{ m.content }} {% endfor %}{{ eos_token }}"
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": [{"name": "default", "template": source}] if as_list else source,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(str(tmp_path))
    assert tok.chat_template == source
    template = ChatTemplate(
        resolve_chat_template(None, tok.chat_template, str(tmp_path)),
        bos_token="<s>",
        eos_token="</s>",
    )
    text = template.render([{"role": "user", "content": "hello world"}])
    assert text == "<s>hello world </s>"
    assert tok.encode(text) == [3, 1, 2, 4]


def test_template_errors_are_request_errors():
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        template.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% if %}")
