"""One property suite over every family (random outputs, random chunkings).

For each case of `cases.CASES`: the stream split equals the whole split; the engine
side (`advance`, another chunking) finds the answer at the same absolute token as the
front end (`split_bytes`); an independent oracle agrees with the split, the answer
start and the reasoning token count; rollback then re-feeding changes nothing;
``include_reasoning=False`` drops only reasoning; the engine hints (start-marker
continuations, end-marker ids) do what they promise.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import pytest
from hypothesis import strategies as st

from reasoning import AnswerStart, Phase, ReasoningStream, ReasoningTracker
from tests.support.properties import property_test

from .cases import CASES, Case, chunkings, chunks, output_strategy, parser_for, tokenizer_for

#: every property over every case; each runs at a default-run volume sized so that the
#: whole file takes well under a minute on 2 cores, and ten times that in its ``_full``
#: twin (``-m slow``)
pytestmark = pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])


def _draw_output(data: st.DataObject, case: Case) -> tuple[Phase, list[int]]:
    phase = data.draw(st.sampled_from(case.phases), label="phase")
    ids = data.draw(output_strategy(case), label="ids")
    return phase, ids


def _feed_text(
    tracker: ReasoningTracker, parts: Sequence[Sequence[int]], offset: int = 0
) -> tuple[bytes, bytes, tuple[int, bytes] | None]:
    """Front end: feed ``parts`` with `split_bytes`, then flush. Returns the bytes and
    the answer start as (absolute index, prefix)."""
    r, c, found = [], [], None
    for part in parts:
        text, start = tracker.split_bytes(part)
        r.append(text.reasoning)
        c.append(text.content)
        if start is not None:
            assert found is None, "the answer starts once"
            found = (offset + start.index, start.prefix)
        offset += len(part)
    tail = tracker.flush()
    return b"".join(r) + tail.reasoning, b"".join(c) + tail.content, found


def _feed_engine(
    tracker: ReasoningTracker, parts: Sequence[Sequence[int]], offset: int = 0
) -> tuple[int, bytes] | None:
    found = None
    for part in parts:
        start = tracker.advance(part)
        if start is not None:
            assert found is None, "the answer starts once"
            assert start.index <= len(part)
            found = (offset + start.index, start.prefix)
        offset += len(part)
    return found


def _split_matches_oracle_and_stream(case: Case, data: st.DataObject) -> None:
    parser, tok = parser_for(case), tokenizer_for(case)
    phase, ids = _draw_output(data, case)
    expected = case.oracle(tok, ids, phase)

    # (3) + (4): the front end's bytes, answer start and count against the oracle
    sizes = data.draw(chunkings(len(ids)), label="front-end chunks")
    tracker = parser.new_tracker(phase)
    reasoning, content, found = _feed_text(tracker, chunks(ids, sizes))
    assert reasoning == expected.reasoning
    assert content == expected.content
    want = None if expected.answer_at is None else (expected.answer_at, expected.prefix)
    assert found == want
    assert tracker.num_reasoning_tokens == expected.num_reasoning_tokens

    # (1): stream deltas concatenate to the whole split, whatever the chunking
    whole = ReasoningStream(parser.new_tracker(phase))
    a, b = whole.push(ids), whole.finish()
    stream = ReasoningStream(parser.new_tracker(phase))
    deltas = [stream.push(part) for part in chunks(ids, sizes)] + [stream.finish()]
    assert "".join(d.reasoning for d in deltas) == a.reasoning + b.reasoning
    assert "".join(d.content for d in deltas) == a.content + b.content
    assert (a.reasoning + b.reasoning).encode() == expected.reasoning.decode(
        "utf-8", "replace"
    ).encode()

    # (6): include_reasoning=False drops reasoning deltas and nothing else
    hidden = ReasoningStream(parser.new_tracker(phase), include_reasoning=False)
    hidden_deltas = [hidden.push(part) for part in chunks(ids, sizes)] + [hidden.finish()]
    assert all(d.reasoning == "" for d in hidden_deltas)
    assert [d.content for d in hidden_deltas] == [d.content for d in deltas]
    assert hidden.num_reasoning_tokens == stream.num_reasoning_tokens


test_split_matches_oracle_and_stream = property_test(_split_matches_oracle_and_stream, 50)
test_split_matches_oracle_and_stream_full = property_test(
    _split_matches_oracle_and_stream, 500, slow=True
)


def _engine_agrees_with_front_end(case: Case, data: st.DataObject) -> None:
    # (2): the engine's answer start (its own chunking) is the front end's
    parser = parser_for(case)
    phase, ids = _draw_output(data, case)
    front = parser.new_tracker(phase)
    engine = parser.new_tracker(phase)
    front_found = _feed_text(front, chunks(ids, data.draw(chunkings(len(ids)))))[2]
    engine_found = _feed_engine(engine, chunks(ids, data.draw(chunkings(len(ids)))))
    assert engine_found == front_found
    assert engine.phase == front.phase
    engine.flush()
    assert engine.num_reasoning_tokens == front.num_reasoning_tokens


test_engine_agrees_with_front_end = property_test(_engine_agrees_with_front_end, 30)
test_engine_agrees_with_front_end_full = property_test(
    _engine_agrees_with_front_end, 300, slow=True
)


def _rollback_then_refeed(case: Case, data: st.DataObject) -> None:
    # (5): a tracker fed P, then X, rolled back over all of X (or part of it), then fed
    # the rest behaves exactly as one fed only what was kept.
    parser = parser_for(case)
    phase, ids = _draw_output(data, case)
    junk = data.draw(output_strategy(case), label="junk")
    cut = data.draw(st.integers(0, len(ids)), label="cut")
    prefix, suffix = ids[:cut], ids[cut:]
    x_parts = chunks(junk, data.draw(chunkings(len(junk), max_parts=8)))
    undo = data.draw(st.integers(0, len(junk)), label="undo")
    kept = junk[: len(junk) - undo]
    p_parts = chunks(prefix, data.draw(chunkings(len(prefix))))
    s_parts = chunks(suffix, data.draw(chunkings(len(suffix))))

    for text_mode in (False, True):
        rolled = parser.new_tracker(phase)
        plain = parser.new_tracker(phase)
        feed = _feed_text if text_mode else _feed_engine
        for part in p_parts:
            for t in (rolled, plain):
                (t.split_bytes if text_mode else t.advance)(part)
        for part in x_parts:
            (rolled.split_bytes if text_mode else rolled.advance)(part)
        rolled.rollback(undo)
        (plain.split_bytes if text_mode else plain.advance)(kept)
        assert rolled.phase == plain.phase
        assert rolled.num_reasoning_tokens == plain.num_reasoning_tokens
        assert feed(rolled, s_parts) == feed(plain, s_parts)
        assert rolled.num_reasoning_tokens == plain.num_reasoning_tokens


test_rollback_then_refeed = property_test(_rollback_then_refeed, 30)
test_rollback_then_refeed_full = property_test(_rollback_then_refeed, 300, slow=True)


def _engine_hints(case: Case, data: st.DataObject) -> None:
    """In UNDECIDED, a start-marker continuation never starts the answer; in THINKING,
    feeding `end_marker_ids` closes reasoning with its last id."""
    parser = parser_for(case)
    phase, ids = _draw_output(data, case)
    tracker = parser.new_tracker(phase)
    for i in range(len(ids)):
        if tracker.phase == Phase.UNDECIDED:
            conts = tracker.start_marker_continuations()
            assert conts, "an undecided tracker can always go on opening reasoning"
            for t in data.draw(st.lists(st.sampled_from(list(conts)), max_size=3)):
                assert tracker.advance([t]) is None
                assert tracker.phase != Phase.ANSWER
                tracker.rollback(1)
        if tracker.phase == Phase.THINKING and data.draw(st.integers(0, 3)) == 0:
            forced = list(tracker.end_marker_ids())
            assert forced
            start = tracker.advance(forced)
            assert tracker.phase != Phase.THINKING
            if tracker.phase == Phase.ANSWER:
                assert start == AnswerStart(len(forced))
            tracker.rollback(len(forced))
            assert tracker.phase == Phase.THINKING
        tracker.advance(ids[i : i + 1])


test_engine_hints = property_test(_engine_hints, 25)
test_engine_hints_full = property_test(_engine_hints, 250, slow=True)


def _ending_tokens(case: Case, data: st.DataObject) -> None:
    """In THINKING, a token that would close reasoning with bytes after the end marker
    (`AnswerStart.prefix`) is among `ending_tokens`' ids; states with the same key
    have the same ids, and each of them fed gives the same answer start; `probe` says
    what `advance` says and leaves the state (and the rollback window) as it was.
    Tokens tried at each step: the output's next one, random ones of the vocabulary,
    and random ones holding an end marker's last byte (those that may close it)."""
    parser = parser_for(case)
    phase, ids = _draw_output(data, case)
    tracker = parser.new_tracker(phase)
    closers = _closers(case)
    seen: dict[object, tuple[tuple[int, ...], dict[int, AnswerStart | None]]] = {}
    vocab = st.integers(0, len(parser.tokenizer.all_token_bytes) - 1)
    for i in range(len(ids) + 1):
        if tracker.phase == Phase.THINKING:
            hint = tracker.ending_tokens()
            key, named = hint if hint is not None else (None, ())
            named_set = set(named)
            tries = [*ids[i : i + 1], *data.draw(st.lists(vocab, max_size=4), label="random")]
            if closers:
                tries += data.draw(st.lists(st.sampled_from(closers), max_size=6), label="c")
            if named:
                tries += data.draw(st.lists(st.sampled_from(named), max_size=4), label="named")
            before = tracker._save(), len(tracker._checkpoints)
            for t in tries:
                start = tracker.probe(t)
                assert (tracker._save(), len(tracker._checkpoints)) == before
                if start is not None and start.prefix:
                    assert t in named_set, (t, start)
                if hint is None:
                    continue
                known = seen.setdefault(key, (tuple(named), {}))
                assert known[0] == tuple(named), key
                assert known[1].setdefault(t, start) == start, (key, t)
            for t in tries[-2:]:
                start = tracker.probe(t)
                assert tracker.advance([t]) == start
                tracker.rollback(1)
                assert tracker._save() == before[0]
        if i < len(ids):
            tracker.advance(ids[i : i + 1])


@cache
def _closers_of(case_id: str) -> list[int]:
    case = next(c for c in CASES if c.id == case_id)
    tracker = parser_for(case).new_tracker(Phase.THINKING)
    end = getattr(getattr(tracker, "_p", None), "end", None)
    if end is None:
        return []
    lasts = {v[-1:] for v in end.variants}
    tb = parser_for(case).tokenizer.all_token_bytes
    return [t for t, b in enumerate(tb) if any(x in b for x in lasts)]


def _closers(case: Case) -> list[int]:
    """The ids whose bytes hold the last byte of an end spelling (text markers only)."""
    return _closers_of(case.id)


test_ending_tokens = property_test(_ending_tokens, 25)
test_ending_tokens_full = property_test(_ending_tokens, 250, slow=True)


def _grammar_text(parser, phase: Phase, ids: Sequence[int]) -> bytes | None:
    """What the engine would feed an answer's grammar, driving the tracker token by
    token as the engine's guide does: the tokens of an undecided stretch that turned
    out to be the answer, the closing token of an implicit end, the bytes a text marker
    carries after it, and every answer token but layout (`take_layout`). None when the
    output never reaches its answer."""
    tb = parser.tokenizer.token_bytes
    tracker = parser.new_tracker(phase)
    if phase == Phase.ANSWER:
        return b"".join(tb(t) for t in ids)
    fed: list[bytes] | None = None
    layout = False
    for i, t in enumerate(ids):
        if fed is not None:
            if layout:
                if tracker.take_layout(t):
                    layout = tracker.in_layout
                    continue
                layout = False
            fed.append(tb(t))
            continue
        start = tracker.advance([t])
        if start is None:
            continue
        first = i + start.index
        fed = [start.prefix] + [tb(x) for x in ids[max(first, 0) : i + 1]]
        layout = tracker.in_layout
    return None if fed is None else b"".join(fed)


def _content_is_what_the_grammar_saw(case: Case, data: st.DataObject) -> None:
    """Layout is read alike on both sides: for a family without an answer wrapper, the
    front end's content is exactly the text the engine feeds the answer's grammar."""
    parser = parser_for(case)
    if getattr(parser, "answer_wrapper", None) is not None:
        return  # the wrapper takes its tags out of the content (test_families)
    phase, ids = _draw_output(data, case)
    fed = _grammar_text(parser, phase, ids)
    _, content, found = _feed_text(parser.new_tracker(phase), [ids])
    if fed is None:
        assert found is None
        return
    assert content == fed


test_content_is_what_the_grammar_saw = property_test(_content_is_what_the_grammar_saw, 30)
test_content_is_what_the_grammar_saw_full = property_test(
    _content_is_what_the_grammar_saw, 300, slow=True
)
