"""One split, three readers: `ReasoningParser.split` of the whole output, the stream
split (`ReasoningStream`, any chunking) and the front end's message (`OutputProcessor`
over the request's tracker) give the same reasoning and content (the front end less
the template's layout inside the thinking markers), for every reasoning
family in the registry, on the reasoning suite's generated outputs (markers, partial
markers, separators written whole, in part and run past, multi-byte text)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_core.client import RequestOutput
from frontend.chunks import CompletionAccumulator
from frontend.response import THINKING_LAYOUT, OutputProcessor, ThinkingLayout
from ipc import FinishReason
from reasoning import Phase, ReasoningStream, reasoning_parser_names
from tests.reasoning.cases import CASES, chunkings, chunks, output_strategy, parser_for

#: one property case per registered family (its vocabulary and kwargs)
FAMILY_CASES = {
    name: next(c for c in CASES if c.parser == name) for name in reasoning_parser_names()
}


@pytest.mark.parametrize("family", sorted(FAMILY_CASES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_split_stream_and_front_end_agree(family: str, data: st.DataObject) -> None:
    case = FAMILY_CASES[family]
    parser = parser_for(case)
    ids = data.draw(output_strategy(case), label="ids")
    sizes = data.draw(chunkings(len(ids)), label="chunks")
    parts = chunks(ids, sizes) or [[]]

    whole = parser.split(ids)

    stream = parser.stream()
    deltas = [stream.push(p) for p in parts] + [stream.finish()]
    streamed = (
        "".join(d.reasoning for d in deltas) or None,
        "".join(d.content for d in deltas) or None,
    )

    tracker = parser.tracker((), parser.reasoning_ended(()))
    proc = OutputProcessor(
        token_bytes=parser.tokenizer.token_bytes, prompt_tokens=0, tracker=tracker, tool_parser=None
    )
    acc = CompletionAccumulator()
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        acc.add(proc.push(RequestOutput("r", p, FinishReason.STOP if last else None, None)))
    message = acc.message()

    assert streamed == whole
    # the front end also leaves out the newlines the family's template writes inside
    # the thinking markers (`THINKING_LAYOUT`), the one place that rule lives
    ended = tracker.phase == Phase.ANSWER
    trimmed = ThinkingLayout(THINKING_LAYOUT).push(whole[0] or "", ended=ended, final=True)
    assert (message.reasoning, message.content) == (trimmed or None, whole[1])
    assert proc.usage.completion_tokens_details.reasoning_tokens == stream.num_reasoning_tokens


def test_a_stream_without_a_parser_is_all_content() -> None:
    tok = parser_for(CASES[0]).tokenizer
    ids = tok.encode("東京 {}")
    stream = ReasoningStream(None, token_bytes=tok.token_bytes)
    pieces = [stream.push([t]) for t in ids] + [stream.finish()]
    assert "".join(p.content for p in pieces) == "東京 {}"
    assert not any(p.reasoning for p in pieces) and stream.num_reasoning_tokens == 0
    with pytest.raises(ValueError):
        ReasoningStream(None)
