"""One split, three readers: `ReasoningParser.split` of the whole output, the stream
split (`ReasoningStream`, any chunking) and the front end's message (`OutputProcessor`
over the request's tracker) give the same reasoning and content (the front end less
the template's layout inside the thinking markers), for every reasoning
family in the registry, on the reasoning suite's generated outputs (markers, partial
markers, separators written whole, in part and run past, multi-byte text)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_core.client import RequestOutput
from frontend.chunks import CompletionAccumulator
from frontend.protocol import ChatMessage
from frontend.response import THINKING_LAYOUT, OutputProcessor, ThinkingLayout
from ipc import FinishReason
from reasoning import Phase, ReasoningParser, ReasoningStream, reasoning_parser_names
from tests.reasoning.cases import (
    CASES,
    Case,
    chunkings,
    chunks,
    output_strategy,
    parser_for,
)

#: one property case per registered family (its vocabulary and kwargs)
FAMILY_CASES = {
    name: next(c for c in CASES if c.parser == name) for name in reasoning_parser_names()
}


@pytest.mark.parametrize("family", sorted(FAMILY_CASES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_split_stream_and_front_end_agree(family: str, data: st.DataObject) -> None:
    case = FAMILY_CASES[family]
    ids = data.draw(output_strategy(case), label="ids")
    sizes = data.draw(chunkings(len(ids)), label="chunks")
    _check_three_readers(parser_for(case), ids, sizes, ())


#: UTF-8 sequences a model may leave unfinished right before its end marker: a lead
#: byte alone (held back by the decoder), 2 of 3 bytes, 3 of 4, one byte per token;
#: and a lone continuation byte (replaced at once, never held)
UNFINISHED = (b"\xc2", "漢".encode()[:2], "🙂".encode()[:3], b"\x80")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_unfinished_utf8_sequence_before_the_end_marker_stays_in_the_thinking(
    case: Case,
) -> None:
    """The thinking ends with a newline, then bytes of a UTF-8 sequence the model
    never finished, then the end marker (each of the family's markers that end the
    thinking): the replacement character stands before the marker in the reasoning,
    the newline is the model's (not the template's layout), and whole, streamed in
    any cut and the front end agree."""
    parser = parser_for(case)
    tok = parser.tokenizer
    byte_id = {
        b: i for i, b in enumerate(tok.all_token_bytes) if len(b) == 1 and not tok.is_special(i)
    }

    def encode(marker: str | tuple[str, ...]) -> list[int]:
        parts = marker if isinstance(marker, tuple) else (marker,)
        return [t for part in parts for t in tok.encode(part)]

    # the front end says the prompt left the thinking open; the output opens it itself
    # where it starts undecided
    prompt = ()
    start = parser.tracker(prompt, False).phase
    opened = encode(case.opens[0]) if start == Phase.UNDECIDED else []
    checked = 0
    for close in case.closes:
        for unfinished in UNFINISHED:
            ids = [
                *opened,
                *tok.encode("Hello\n", special=False),
                *(byte_id[bytes([b])] for b in unfinished),
                *encode(close),
                *tok.encode("OK", special=False),
            ]
            tracker = parser.tracker(prompt, False)
            tracker.split_bytes(ids)
            if tracker.phase != Phase.ANSWER:
                continue  # this "close" does not end the thinking here
            whole = parser.split(ids, prompt, False)
            assert whole[0] is not None and whole[0].startswith("Hello\n\ufffd"), (close, whole)
            cuts = [[len(ids)], [1] * len(ids)] + [[k, len(ids) - k] for k in range(1, len(ids))]
            for sizes in cuts:
                message = _check_three_readers(parser, ids, sizes, prompt, False)
                assert message.reasoning is not None
                assert message.reasoning.startswith("Hello\n\ufffd"), (close, sizes, message)
            checked += 1
    assert checked, f"no marker of {case.id} ends its thinking"


def _check_three_readers(
    parser: ReasoningParser,
    ids: list[int],
    sizes: list[int],
    prompt: Sequence[int],
    reasoning_ended: bool | Literal["prompt"] = "prompt",
) -> ChatMessage:
    """Assert that the split of the whole output, the stream split over ``sizes`` and
    the front end's message agree; return the message."""
    parts = chunks(ids, sizes) or [[]]
    whole = parser.split(ids, prompt, reasoning_ended)

    stream = parser.stream(prompt, reasoning_ended)
    deltas = [stream.push(p) for p in parts] + [stream.finish()]
    streamed = (
        "".join(d.reasoning for d in deltas) or None,
        "".join(d.content for d in deltas) or None,
    )

    if reasoning_ended == "prompt":
        reasoning_ended = parser.reasoning_ended(prompt)
    tracker = parser.tracker(prompt, reasoning_ended)
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
    return message


def test_a_stream_without_a_parser_is_all_content() -> None:
    tok = parser_for(CASES[0]).tokenizer
    ids = tok.encode("東京 {}")
    stream = ReasoningStream(None, token_bytes=tok.token_bytes)
    pieces = [stream.push([t]) for t in ids] + [stream.finish()]
    assert "".join(p.content for p in pieces) == "東京 {}"
    assert not any(p.reasoning for p in pieces) and stream.num_reasoning_tokens == 0
    with pytest.raises(ValueError):
        ReasoningStream(None)
