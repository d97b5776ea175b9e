"""While thinking, a token that would complete a text end marker (OLMo 3's ``</think>``
in ordinary tokens) and carry answer bytes after it that the grammar rejects is
banned (`RequestGuide`); one whose bytes the grammar accepts, or that are the family's
layout, is not. Driven for every family of the reasoning cases whose end marker is
text, on its real vocabulary, with the engine's guarded xgrammar matchers.

The grammar's first character is fixed up to one optional newline (``\\n?\\[...``),
so most tails are rejected and a few are not. The expected bans come from an oracle
that reads the vocabulary itself: a token that starts with the rest of the marker
after the held tail and is longer carries the bytes after that rest; they are layout
where they continue the family's separator, else the answer's first bytes.
"""

from __future__ import annotations

import pytest

from reasoning import Phase
from reasoning.text_markers import TextMarkersTracker
from reasoning.vocab import vocab_index
from structured_output import GrammarSpec, LocalCompiler
from structured_output.guide import GuideError, RequestGuide
from tests.reasoning.cases import CASES, parser_for

PATTERN = r"\n?\[[a-z]*\]"
THOUGHT = "Let me see. "

TEXT_CASES = [
    c for c in CASES if isinstance(parser_for(c).new_tracker(Phase.THINKING), TextMarkersTracker)
]


def test_the_text_marker_families_are_all_here():
    """Every text-marker parser of the registry has a case (so none is skipped)."""
    assert {c.parser for c in TEXT_CASES} >= {"olmo3", "granite", "hunyuan_a13b", "mistral"}


@pytest.fixture(scope="module")
def compilers():
    made: dict[str, LocalCompiler] = {}

    def get(case):
        if case.id not in made:
            made[case.id] = LocalCompiler(parser_for(case).tokenizer)
        return made[case.id]

    return get


def _thinking_guide(case, compiler, grammar, held: bytes) -> tuple[RequestGuide, list[int]]:
    """A guide whose thought is `THOUGHT` then ``held`` (a proper prefix of an end
    spelling), fed token by token as the engine feeds it."""
    parser = parser_for(case)
    tok = parser.tokenizer
    tracker = parser.new_tracker(Phase.THINKING)
    guide = RequestGuide(
        tracker,
        compiler.matcher(grammar),
        implicit_end_ids=parser.implicit_end_ids,
        stop_token_ids=tok.stop_token_ids,
    )
    out: list[int] = []
    for t in tok.encode(THOUGHT, special=False) + tok.encode(held.decode(), special=False):
        out.append(t)
        guide.accept(t, out)
    assert guide.thinking and tracker._held.endswith(held)
    return guide, out


@pytest.mark.parametrize("case", TEXT_CASES, ids=[c.id for c in TEXT_CASES])
def test_a_token_completing_the_end_marker_with_rejected_bytes_is_banned(case, compilers):
    parser = parser_for(case)
    tok = parser.tokenizer
    compiler = compilers(case)
    grammar = compiler.compile(GrammarSpec.of("regex", PATTERN))
    index = vocab_index(tok)
    markers = parser.new_tracker(Phase.THINKING)._p  # Mistral's own text machine
    sep = markers.content_separator
    variants = markers.end.variants
    # The oracle's premise: no spelling completes inside another's proper prefix.
    assert not any(w in v[:-1] for v in variants for w in variants)
    seen = {"banned": 0, "accepted": 0, "layout": 0}
    for v in variants:
        for k in range(1, len(v)):
            held, rest = v[:k], v[k:]
            guide, out = _thinking_guide(case, compiler, grammar, held)
            banned = set(guide.banned)
            assert set(tok.stop_token_ids) <= banned
            assert not banned & set(guide.tracker.end_marker_ids()), "the forced end is banned"
            fresh = compiler.matcher(grammar)
            expected, allowed = set(), []
            for t in index.longer_with_prefix(rest):
                after = tok.token_bytes(t)[len(rest) :]
                if sep and sep.startswith(after):
                    seen["layout"] += 1
                    allowed.append(t)
                elif fresh.accept_string(after):
                    fresh.rollback(1)
                    seen["accepted"] += 1
                    allowed.append(t)
                else:
                    expected.add(t)
            seen["banned"] += len(expected)
            candidates = set(index.longer_with_prefix(rest))
            assert banned & candidates == expected, (held, rest)
            # What a ban prevents: the answer's first bytes rejected, an error.
            for t in sorted(expected)[:3]:
                g, o = _thinking_guide(case, compiler, grammar, held)
                with pytest.raises(GuideError, match="first characters are rejected"):
                    g.accept(t, [*o, t])
            # What stays allowed ends the thought, and the grammar then takes a whole
            # answer from where those bytes left it (working out the bans left it fresh).
            for t in allowed[:3]:
                g, o = _thinking_guide(case, compiler, grammar, held)
                g.accept(t, [*o, t])
                assert g.phase == Phase.ANSWER
                tail = tok.token_bytes(t)[len(rest) :]
                seen_by_grammar = b"" if sep and sep.startswith(tail) else tail
                more = _completion(seen_by_grammar)
                assert not more or g.matcher.accept_string(more), (tail, more)
                assert g.matcher.accept_token(tok.stop_token_ids[0]) and g.terminated
    assert seen["banned"] and seen["accepted"] + seen["layout"], seen


def _completion(seen: bytes) -> bytes:
    """What completes ``seen`` (a prefix the grammar accepted) into a whole answer."""
    if seen in (b"", b"\n"):
        return b"[ab]"
    return b"" if seen.endswith(b"]") else b"ab]"
