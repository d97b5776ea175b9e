"""Stop strings, owned by the front end: real token ids of the Qwen3 vocabulary, texts
whose characters span several tokens, stop strings that begin and end inside tokens
and inside characters, fed in every chunking.

The engine knows nothing of stop strings, so it keeps writing past one; the front end
must cut the text right before the first stop string to complete, whatever the
chunking, and stream no byte of it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_core.client import RequestOutput
from frontend.chunks import CompletionAccumulator
from frontend.response import OutputProcessor
from frontend.stop_strings import StopStringGate
from ipc import Codec, EngineCoreOutput, EngineCoreOutputs, FinishReason, TokenLogprobs
from reasoning import create_reasoning_parser
from tokenization import load_tokenizer

TOK = load_tokenizer("qwen3")
EOS = TOK.eos_token_id
PROMPT = TOK.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
# characters the vocabulary splits over two tokens (4+0 bytes: 3 + 1; 2 bytes: 1 + 1)
SPLIT_CHARS = "🦜𝔘ǅ丒"
ALPHABET = "ab xy.\n" + SPLIT_CHARS + "é東京ⓐ"


def first_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    """The oracle: where the stop string that completes first begins (ties: the one
    that begins first), by scanning every prefix of the text."""
    for end in range(1, len(text) + 1):
        found = [(end - len(s), s) for s in stops if text[:end].endswith(s)]
        if found:
            return min(found)
    return None


def feed(proc: OutputProcessor, ids: list[int], cuts, *, logprobs: bool = False):
    """Feed ``ids`` (then EOS) in pieces, as the engine would send them, until the
    processor says the output is over; return the deltas."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(ids))), len(ids)]
    deltas = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece = ids[a:b]
        last = b == len(ids)
        if last:
            piece = piece + [EOS]
        lp = TokenLogprobs([-float(t % 7) for t in piece]) if logprobs else None
        out = RequestOutput(
            "r",
            piece,
            FinishReason.STOP if last else None,
            EOS if last else None,
            logprobs=lp,
        )
        deltas.append(proc.push(out))
        if proc.finished:
            break
    return deltas


def plain(stops, **kw) -> OutputProcessor:
    return OutputProcessor(
        token_bytes=TOK.token_bytes,
        prompt_tokens=1,
        tracker=None,
        tool_parser=None,
        stop=stops,
        **kw,
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_text_before_the_first_stop_whatever_the_chunking(data):
    text = data.draw(st.text(ALPHABET, min_size=1, max_size=30), label="text")
    ids = TOK.encode(text)
    # stop strings taken from the text (they occur) and from the alphabet (they may)
    stops = data.draw(
        st.lists(
            st.one_of(
                st.builds(
                    lambda a, n: text[a : a + n], st.integers(0, len(text) - 1), st.integers(1, 4)
                ),
                st.text(ALPHABET, min_size=1, max_size=3),
            ),
            min_size=1,
            max_size=3,
        ).map(lambda xs: [x for x in xs if x] or ["zz"]),
        label="stops",
    )
    cuts = data.draw(st.lists(st.integers(1, max(1, len(ids) - 1)), max_size=8), label="cuts")
    expected = first_stop(text, stops)

    whole_proc = plain(stops)
    whole = "".join(d.content for d in feed(whole_proc, ids, []))
    streamed_proc = plain(stops)
    pieces = [d.content for d in feed(streamed_proc, ids, cuts)]
    streamed = "".join(pieces)
    assert streamed == whole
    if expected is None:
        assert whole == text and whole_proc.stop_reason is None
    else:
        start, stop = expected
        assert whole == text[:start]
        assert whole_proc.stop_reason == streamed_proc.stop_reason == stop
        assert whole_proc.finish_reason == "stop"
    # nothing streamed ever holds a byte of the stop string that ends the text
    so_far = ""
    for p in pieces:
        so_far += p
        assert text.startswith(so_far)


def test_a_stop_string_inside_one_character_and_across_tokens():
    # "🦜" is [f0 9f a6] + [9c]: a stop string of its last three bytes cannot be
    # written as text, but a stop of the whole character straddles the two tokens
    text = "ab🦜cd"
    ids = TOK.encode(text)
    for cut in range(len(ids) + 1):
        proc = plain(["🦜c"])
        out = "".join(d.content for d in feed(proc, ids, [cut]))
        assert out == "ab" and proc.stop_reason == "🦜c", cut
    # the stop string begins inside a token: "bc" where "ab" may be one token
    ids = TOK.encode("xxabcx")
    for cut in range(len(ids) + 1):
        proc = plain(["bc"])
        assert "".join(d.content for d in feed(proc, ids, [cut])) == "xxa", cut


def test_the_stop_that_completes_first_wins():
    ids = TOK.encode("one two three")
    # "one two three" begins first, but "two" completes first
    proc = plain(["one two three", "two"])
    assert "".join(d.content for d in feed(proc, ids, [])) == "one "
    assert proc.stop_reason == "two"
    # two that complete at the same byte: the longer one begins first
    proc = plain(["three", "o three"])
    assert "".join(d.content for d in feed(proc, ids, [])) == "one tw"
    assert proc.stop_reason == "o three"


def test_reasoning_and_content_identical_whole_and_streamed():
    parser = create_reasoning_parser("qwen3", TOK, {})
    text = "<think>\nPlan 🦜 one. END of plan\n</think>\n\nAnswer 東京 here. END now"
    ids = TOK.encode(text)

    def run(cuts, stops):
        proc = OutputProcessor(
            token_bytes=TOK.token_bytes,
            prompt_tokens=len(PROMPT),
            tracker=parser.tracker(PROMPT, parser.reasoning_ended(PROMPT)),
            tool_parser=None,
            stop=stops,
        )
        acc = CompletionAccumulator()
        for d in feed(proc, ids, cuts):
            acc.add(d)
        m = acc.message()
        return m.reasoning, m.content, proc.finish_reason, proc.stop_reason

    whole = run([], ["END"])
    assert whole == ("Plan 🦜 one. ", None, "stop", "END")
    for k in range(1, len(ids)):
        assert run([k], ["END"]) == whole, k
    assert run(range(1, len(ids)), ["END"]) == whole
    # a stop string in the answer only
    answer = run([], ["東京"])
    assert answer == ("Plan 🦜 one. END of plan", "Answer ", "stop", "東京")
    for k in range(1, len(ids)):
        assert run([k], ["東京"]) == answer, k


def test_logprobs_follow_the_cut_text():
    ids = TOK.encode("abc 🦜 STOP def")
    proc = plain(["STOP"], logprobs=True)
    deltas = feed(proc, ids, range(1, len(ids)), logprobs=True)
    text = "".join(d.content for d in deltas)
    entries = [e for d in deltas for e in d.logprobs or []]
    assert text == "abc 🦜 "
    # one entry per token whose bytes reached the text, in order: the last one is
    # " STOP", cut inside
    covered = b"".join(TOK.token_bytes(e.token_id) for e in entries)
    last = TOK.token_bytes(entries[-1].token_id)
    assert covered.startswith(text.encode()) and len(covered) - len(last) < len(text.encode())
    assert last == b" STOP"
    assert [e.logprob for e in entries] == [-float(e.token_id % 7) for e in entries]


def test_gate_releases_whole_tokens_only_and_holds_what_may_begin_a_stop():
    gate = StopStringGate(["ABCD"], TOK.token_bytes)
    ids = TOK.encode("xx yy zz AB")
    released, partial = gate.push(ids)
    assert not partial and gate.hit is None
    held = ids[len(released) :]
    assert b"".join(TOK.token_bytes(t) for t in held).endswith(b"AB")
    assert len(b"".join(TOK.token_bytes(t) for t in held[1:])) < 3
    assert gate.flush() == held


@pytest.mark.parametrize("stops", [[""], []])
def test_gate_refuses_empty_stop_strings(stops):
    with pytest.raises(ValueError):
        StopStringGate(stops, TOK.token_bytes)


def test_every_finish_reason_is_truthy_and_survives_the_wire():
    codec = Codec()
    for reason in FinishReason:
        assert reason and str(reason) == reason.value
        out = EngineCoreOutputs([EngineCoreOutput("r", [1], finish_reason=reason)])
        (back,) = codec.decode(codec.encode(out)).outputs
        assert back.finish_reason is reason
