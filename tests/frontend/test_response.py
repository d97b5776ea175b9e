"""The output machine without an engine: real token ids of the Qwen3 vocabulary, the
qwen3 reasoning parser and the hermes format, fed in every chunking. The stream's
pieces must fold into the whole response exactly, whatever the chunking."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_core.client import RequestOutput
from frontend.chunks import ChunkMaker, CompletionAccumulator
from frontend.response import OutputProcessor
from frontend.tool_formats import FunctionTool, create_tool_format
from ipc import FinishReason
from reasoning import create_reasoning_parser
from tests.support.work import lines_run
from tokenization import load_tokenizer

TOK = load_tokenizer("qwen3")
EOS = TOK.eos_token_id
PROMPT_ON = TOK.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
PROMPT_OFF = PROMPT_ON + TOK.encode("<think>\n\n</think>\n\n")
TOOLS = [FunctionTool("get_weather", {"type": "object"}), FunctionTool("get_time", None)]

THOUGHT = "<think>\nThe user wants the weather: é, 東京.\n</think>\n\n"
CALL_A = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_B = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'


def processor(*, kwargs=None, tools=True, prompt=PROMPT_ON, **extra) -> OutputProcessor:
    parser = create_reasoning_parser("qwen3", TOK, kwargs or {})
    tracker = parser.tracker(prompt, parser.reasoning_ended(prompt))
    fmt = create_tool_format("hermes", TOK)
    return OutputProcessor(
        token_bytes=TOK.token_bytes,
        prompt_tokens=len(prompt),
        tracker=tracker,
        tool_parser=fmt.new_parser(TOOLS) if tools else None,
        **extra,
    )


def run(ids, cuts=(), *, finish=FinishReason.STOP, stop_reason=None, **kw):
    """Feed ``ids`` cut at ``cuts``; return (message, finish_reason, usage, deltas)."""
    proc = processor(**kw)
    acc = CompletionAccumulator()
    bounds = [0, *sorted(set(cuts)), len(ids)]
    deltas = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        last = i == len(bounds) - 2
        out = RequestOutput("r", ids[a:b], finish if last else None, stop_reason if last else None)
        d = proc.push(out)
        deltas.append(d)
        acc.add(d)
    return acc.message(), proc.finish_reason, proc.usage, deltas


def norm(result):
    """A run's message, finish reason and usage, call ids left out (they are random)."""
    msg, reason, usage = result[:3]
    assert all(c.id for c in msg.tool_calls)
    calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    return msg.reasoning, msg.content, calls, reason, usage


def ids_of(text: str, eos: bool = True) -> list[int]:
    return TOK.encode(text) + ([EOS] if eos else [])


def test_thinking_then_a_call():
    ids = ids_of(THOUGHT + CALL_A)
    msg, reason, usage, _ = run(ids, stop_reason=EOS)
    # the template's newlines inside the markers are layout, not thinking
    assert msg.reasoning == "The user wants the weather: é, 東京."
    assert msg.content is None  # the separator after </think> is layout
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert msg.tool_calls[0].id.startswith("chatcmpl-tool-")
    assert reason == "tool_calls"
    inner = TOK.encode("\nThe user wants the weather: é, 東京.\n")
    assert usage.completion_tokens == len(ids)
    assert usage.completion_tokens_details.reasoning_tokens == len(inner)
    assert usage.prompt_tokens == len(PROMPT_ON)


def test_the_final_stop_token_is_not_text():
    ids = ids_of(THOUGHT + "Sunny.")
    msg, reason, usage, _ = run(ids, stop_reason=EOS)
    assert msg.content == "Sunny." and reason == "stop"
    assert usage.completion_tokens == len(ids)


CASES = {
    "call": THOUGHT + CALL_A,
    "text and two calls": THOUGHT + "Checking. " + CALL_A + "\n" + CALL_B,
    "no thinking": "Plain answer, no <tool thinking.",
    "thinking off": CALL_A,
    "implicit end": "<think>\nhmm <tool_call>tail",
}


@pytest.mark.parametrize("name", CASES)
def test_every_split_point_gives_the_whole(name):
    ids = ids_of(CASES[name])
    kw = (
        {"kwargs": {"enable_thinking": False}, "prompt": PROMPT_OFF}
        if name == "thinking off"
        else {}
    )
    whole = norm(run(ids, stop_reason=EOS, **kw))
    for cut in range(1, len(ids)):
        assert norm(run(ids, [cut], stop_reason=EOS, **kw)) == whole, cut
    assert norm(run(ids, range(1, len(ids)), stop_reason=EOS, **kw)) == whole


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_chunking_gives_the_whole(data):
    name = data.draw(st.sampled_from(sorted(CASES)))
    ids = ids_of(CASES[name])
    cuts = data.draw(st.lists(st.integers(1, len(ids) - 1), max_size=12))
    include = data.draw(st.booleans())
    parallel = data.draw(st.booleans())
    kw = dict(include_reasoning=include, parallel_tool_calls=parallel)
    assert norm(run(ids, cuts, stop_reason=EOS, **kw)) == norm(run(ids, stop_reason=EOS, **kw))


def test_stream_chunks_fold_into_the_message():
    ids = ids_of(CASES["text and two calls"])
    proc = processor()
    chunks = ChunkMaker("id", 0, "m")
    acc = CompletionAccumulator()
    out = [chunks.role()]
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        d = proc.push(
            RequestOutput("r", [t], FinishReason.STOP if last else None, EOS if last else None)
        )
        acc.add(d)
        if d or last:
            out.append(chunks.delta(d, proc.finish_reason if last else None))
    msg = acc.message()
    assert out[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta for c in out]
    assert "".join(d.reasoning or "" for d in deltas) == msg.reasoning
    assert "".join(d.content or "" for d in deltas) == msg.content == "Checking."
    calls: dict[int, dict] = {}
    for d in deltas:
        for c in d.tool_calls:
            if c.index not in calls:
                assert c.id and c.type == "function" and c.function.name
                calls[c.index] = {"id": c.id, "name": c.function.name, "arguments": ""}
            else:
                assert c.id is None and c.type is None and c.function.name is None
            calls[c.index]["arguments"] += c.function.arguments or ""
    assert [(c["id"], c["name"], c["arguments"]) for c in calls.values()] == [
        (c.id, c.function.name, c.function.arguments) for c in msg.tool_calls
    ]
    assert out[-1].choices[0].finish_reason == "tool_calls"
    assert all(c.choices[0].finish_reason is None for c in out[:-1])


def test_include_reasoning_false_drops_the_reasoning_only():
    ids = ids_of(THOUGHT + "Checking. " + CALL_A)
    shown = run(ids, stop_reason=EOS)
    hidden = run(ids, range(1, len(ids)), stop_reason=EOS, include_reasoning=False)
    assert hidden[0].reasoning is None and shown[0].reasoning
    assert all(not d.reasoning for d in hidden[3])
    # the same content, calls, finish reason and usage: the thinking still counts
    assert norm(hidden)[1:] == norm(shown)[1:]


def test_parallel_calls_off_keeps_the_first():
    ids = ids_of(THOUGHT + CALL_A + "\n" + CALL_B)
    both = run(ids, stop_reason=EOS)[0]
    one, reason, _, _ = run(ids, stop_reason=EOS, parallel_tool_calls=False)
    assert [c.function.name for c in both.tool_calls] == ["get_weather", "get_time"]
    assert [c.function.name for c in one.tool_calls] == ["get_weather"]
    assert reason == "tool_calls"


def test_length_keeps_what_parsed():
    cut = CALL_B[:-20]
    ids = TOK.encode(THOUGHT + CALL_A + "\n" + cut)
    msg, reason, _, _ = run(ids, finish=FinishReason.LENGTH)
    assert reason == "length"
    calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    assert calls == [("get_weather", '{"city": "Paris"}')]
    assert msg.content == cut.rstrip()  # a call cut short is no call: its text is content
    cut_in_thought = run(TOK.encode(THOUGHT)[:5], finish=FinishReason.LENGTH)
    assert cut_in_thought[1] == "length" and cut_in_thought[0].content is None


def test_no_tool_parser_leaves_calls_as_text():
    msg = run(ids_of(THOUGHT + CALL_A), stop_reason=EOS, tools=False)[0]
    assert msg.content == CALL_A and not msg.tool_calls


def test_separator_only_after_thinking():
    # thinking off: the output is the answer from its first byte
    off = run(
        ids_of("\n\nKept."), stop_reason=EOS, kwargs={"enable_thinking": False}, prompt=PROMPT_OFF
    )
    assert off[0].content == "\n\nKept."
    # a partial separator is layout too; the next token is the answer's, whole
    ids = ids_of("<think>\nx\n</think>\nOne newline.")
    assert TOK.token_bytes(ids[ids.index(TOK.id_of("</think>")) + 1]) == b"\n"
    partial = run(ids, stop_reason=EOS)
    assert partial[0].content == "One newline."
    # a token running past the separator is not layout: the grammar saw it, so it stays
    ids = ids_of("<think>\nx\n</think>\n\n\nThree.")
    assert TOK.token_bytes(ids[ids.index(TOK.id_of("</think>")) + 1]) == b"\n\n\n"
    more = run(ids, range(1, len(ids)), stop_reason=EOS)
    assert more[0].content == "\n\n\nThree."


def test_engine_error_and_abort():
    proc = processor()
    proc.push(RequestOutput("r", TOK.encode("<think>\nx"), None))
    proc.push(RequestOutput("r", [], FinishReason.ERROR, error="the grammar broke"))
    assert proc.error == "the grammar broke" and proc.finish_reason is None
    resp = proc.error_response(produced_tokens=True)
    assert resp.error.code == 500 and resp.error.message == "the grammar broke"
    assert processor().error_response(produced_tokens=False).error.code == 400
    assert run(TOK.encode("Hi"), finish=FinishReason.ABORT)[1] == "abort"


def test_work_per_token_does_not_grow_with_the_output():
    """Eight times the tokens run about eight times the front end's lines (counted, not
    timed; work that rescanned the output would run about 64 times as many)."""

    def stream(n: int) -> int:
        body = TOK.encode(" word" * n)
        proc = processor(stop=["never matches"])

        def push_all() -> None:
            for t in body:
                proc.push(RequestOutput("r", [t], None))
            proc.push(RequestOutput("r", [EOS], FinishReason.STOP, EOS))

        return lines_run(push_all)

    small, large = stream(250), stream(2000)
    assert large < small * 8 * 1.25, (small, large)
