"""The reasoning gate, with a scripted model whose intended output the test controls:
the thought comes out verbatim, the answer obeys its grammar from its first token."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from engine_core.config import EngineConfig
from frontend.tool_formats import FunctionTool, create_tool_format
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from reasoning import create_reasoning_parser
from structured_output.config import StructuredOutputConfig
from tests.support.engine import NO_WORKERS, EngineHarness, collect
from tests.support.prompts import chat_prompt
from tokenization import load_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
THOUGHT = 'The user wants {"city": "Paris"} but "days" is {missing}; try {"a": [1, 2}'
LONG_THOUGHT = " ".join(f"step{i}" for i in range(60))

SCRIPT = {
    "rules": [
        {
            "match": "[think-json]",
            "output": f'<think>\n{THOUGHT}\n</think>\n\n{{"city": "Paris", "days": 3}}',
        },
        {"match": "[no-think]", "output": '{"city": "Rome", "days": 2}'},
        # what the model would write after an empty thought: a separator first
        {"match": "[closed]", "output": '\n\n{"city": "Oslo", "days": 1}'},
        {"match": "[malformed]", "output": "<think>\nok\n</think>\n\n{city: Paris, days: three}"},
        {
            "match": "[long]",
            "output": f'<think>\n{LONG_THOUGHT}\n</think>\n\n{{"city": "Lima", "days": 4}}',
        },
        {
            "match": "[prose]",
            "output": '<think>\nhm\n</think>\n\nSure! Here it is: {"city": "Bonn"}',
        },
        {
            "match": "[tool-in-thought]",
            "output": (
                '<think>\nI will call it <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
            ),
        },
    ],
    "default": "Hello.",
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("script") / "script.json"
    path.write_text(json.dumps(SCRIPT))
    h = EngineHarness(
        EngineConfig(
            model="scripted",
            runner_options={"script": str(path)},
            reasoning_parser="qwen3",
            structured_output=NO_WORKERS,
        )
    )
    yield h
    h.close()


def _prompt(tok, tag: str, thinking: bool = True) -> list[int]:
    text = f"<|im_start|>user\n{tag}<|im_end|>\n<|im_start|>assistant\n"
    if not thinking:
        text += "<think>\n\n</think>\n\n"
    return tok.encode(text)


def _run(
    engine,
    tag,
    *,
    spec=SCHEMA,
    thinking=True,
    kwargs=None,
    budget=None,
    max_tokens=600,
    greedy=True,
):
    tok = engine.client.tokenizer()
    prompt = _prompt(tok, tag, thinking)
    parser = create_reasoning_parser("qwen3", tok, kwargs)
    so = StructuredOutputSpec("json_schema", json.dumps(spec)) if isinstance(spec, dict) else spec
    req = EngineCoreRequest(
        tag,
        prompt,
        SamplingParams(max_tokens=max_tokens, temperature=0.0 if greedy else 1.0, seed=1),
        so,
        reasoning_ended=parser.reasoning_ended(prompt),
        reasoning_parser_kwargs=kwargs,
        reasoning_budget=budget,
    )
    ids, final, finals = engine.run(lambda: collect(engine.client, req))
    assert finals == 1
    body = ids[:-1] if final.finish_reason == FinishReason.STOP else ids
    reasoning, content = parser.split(body, prompt, parser.reasoning_ended(prompt))
    return ids, final, reasoning, content


def test_thought_verbatim_answer_constrained(engine):
    ids, final, reasoning, content = _run(engine, "[think-json]")
    assert final.finish_reason == FinishReason.STOP, final.error
    assert reasoning == f"\n{THOUGHT}\n"
    assert content == '{"city": "Paris", "days": 3}'  # the separator is layout
    jsonschema.validate(json.loads(content), SCHEMA)
    assert final.num_reasoning_tokens == len(engine.client.tokenizer().encode(f"\n{THOUGHT}\n"))


def test_thinking_off_grammar_from_first_token(engine):
    ids, final, reasoning, content = _run(
        engine, "[no-think]", thinking=False, kwargs={"enable_thinking": False}
    )
    assert final.finish_reason == FinishReason.STOP
    assert reasoning is None
    assert content == '{"city": "Rome", "days": 2}'
    assert final.num_reasoning_tokens == 0


def test_thinking_off_separator_is_allowed_but_grammar_holds(engine):
    # the prompt closed the thinking; a model that still writes "\n\n" first is not
    # pushed off its distribution: JSON grammars admit no leading newline, yet...
    ids, final, reasoning, content = _run(
        engine, "[closed]", thinking=False, kwargs={"enable_thinking": False}
    )
    assert final.finish_reason == FinishReason.STOP
    # ... thinking off means no end marker was seen: the grammar holds from the
    # first token, so the separator is not allowed and the JSON starts at once
    assert content.startswith("{")
    jsonschema.validate(json.loads(content), SCHEMA)


def test_undecided_start_lets_the_model_open_its_thought(engine):
    # enable_thinking on, prompt without <think>: the model may open it or answer
    ids, final, reasoning, content = _run(engine, "[no-think]")
    assert final.finish_reason == FinishReason.STOP
    assert reasoning is None and content == '{"city": "Rome", "days": 2}'


def test_malformed_answer_is_repaired_by_the_mask(engine):
    ids, final, reasoning, content = _run(engine, "[malformed]")
    assert final.finish_reason == FinishReason.STOP
    assert reasoning == "\nok\n"
    jsonschema.validate(json.loads(content), SCHEMA)


def test_prose_answer_is_forced_into_json(engine):
    ids, final, reasoning, content = _run(engine, "[prose]")
    assert final.finish_reason == FinishReason.STOP
    jsonschema.validate(json.loads(content), SCHEMA)


def test_reasoning_budget_ends_a_long_thought_at_16(engine):
    tok = engine.client.tokenizer()
    ids, final, reasoning, content = _run(engine, "[long]", budget=16)
    assert final.finish_reason == FinishReason.STOP
    end = ids.index(tok.id_of("</think>"))
    assert end == 1 + 16  # <think>, 16 thinking tokens, then the forced </think>
    assert final.num_reasoning_tokens == 16
    jsonschema.validate(json.loads(content), SCHEMA)


def test_budget_without_a_grammar(engine):
    tok = engine.client.tokenizer()
    ids, final, reasoning, content = _run(engine, "[long]", spec=None, budget=5)
    end = ids.index(tok.id_of("</think>"))
    assert end == 6
    assert final.num_reasoning_tokens == 5
    assert reasoning == tok.decode(ids[1:end])
    # no grammar: after the forced end the model simply goes on writing
    assert content == tok.decode(ids[end + 1 : -1])


def test_tool_call_in_thought_against_a_json_grammar_is_banned(engine):
    # <tool_call> ends Qwen3's thinking implicitly and would be the answer's first
    # token; a JSON-schema answer cannot start with it, so it is banned while
    # thinking: the thought goes on, and the answer is valid JSON
    # (the stop tokens are banned too: an output that stops while thinking has no
    # answer, so the thought goes on until it is closed, here by a budget)
    tok = engine.client.tokenizer()
    ids, final, reasoning, content = _run(engine, "[tool-in-thought]", max_tokens=400, budget=40)
    assert final.finish_reason == FinishReason.STOP
    end = ids.index(tok.id_of("</think>"))
    assert tok.id_of("<tool_call>") not in ids[:end]
    assert reasoning.startswith("\nI will call it ")
    jsonschema.validate(json.loads(content), SCHEMA)


def test_tool_call_in_thought_against_a_tool_grammar_is_the_answer(engine):
    fmt = create_tool_format("hermes", engine.client.tokenizer())
    tool = FunctionTool("f", {"type": "object", "properties": {}})
    grammar = fmt.constraint([tool], named=None, parallel=False)
    spec = StructuredOutputSpec(grammar.kind.value, grammar.value)
    ids, final, reasoning, content = _run(engine, "[tool-in-thought]", spec=spec)
    assert final.finish_reason == FinishReason.STOP, final.error
    assert reasoning == "\nI will call it "
    assert content == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


def test_errors_end_their_own_request_while_50_others_finish(tmp_path):
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1500)}}
    bad = {
        "invalid_schema": StructuredOutputSpec("json_schema", json.dumps({"type": "objec"})),
        "schema_not_json": StructuredOutputSpec("json_schema", "{"),
        "invalid_regex": StructuredOutputSpec("regex", "(ab"),
        "ebnf_syntax": StructuredOutputSpec("grammar", 'root ::= "a" |'),
        "too_slow": StructuredOutputSpec("json_schema", json.dumps(big)),
        "too_big": StructuredOutputSpec("regex", "a" * 200_000),
    }
    h = EngineHarness(
        EngineConfig(
            model="random",
            seed=5,
            structured_output=StructuredOutputConfig(compile_timeout_s=1.5, max_spec_bytes=100_000),
        )
    )
    try:
        good_spec = StructuredOutputSpec("json_schema", json.dumps(SCHEMA))
        prompt = chat_prompt()

        async def body():
            good = [
                collect(
                    h.client,
                    EngineCoreRequest(
                        f"g{i}",
                        prompt,
                        SamplingParams(max_tokens=200, seed=i),
                        good_spec if i % 2 else None,
                    ),
                )
                for i in range(50)
            ]
            errs = [
                collect(h.client, EngineCoreRequest(k, prompt, SamplingParams(max_tokens=50), s))
                for k, s in bad.items()
            ]
            return await asyncio.gather(*good), await asyncio.gather(*errs)

        goods, errs = h.run(body)
        health = h.run(lambda: h.client.health())
    finally:
        h.close()
    tok = load_tokenizer("qwen3")
    for i, (ids, final, finals) in enumerate(goods):
        assert finals == 1 and final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        if i % 2 and final.finish_reason == FinishReason.STOP:
            jsonschema.validate(json.loads(tok.decode(ids[:-1])), SCHEMA)
    assert (
        sum(f.finish_reason == FinishReason.STOP for i, (_, f, _) in enumerate(goods) if i % 2)
        >= 23
    )
    messages = {}
    for name, (ids, final, finals) in zip(bad, errs, strict=True):
        assert finals == 1 and final.finish_reason == FinishReason.ERROR and ids == [], name
        messages[name] = final.error
    assert "objec" in messages["invalid_schema"]
    assert "not valid JSON" in messages["schema_not_json"]
    assert "regex" in messages["invalid_regex"] and "parenthesis" in messages["invalid_regex"]
    assert "grammar" in messages["ebnf_syntax"]
    assert "time limit" in messages["too_slow"]
    assert "over the limit" in messages["too_big"]
    assert health.num_running == 0 and health.num_waiting == 0
