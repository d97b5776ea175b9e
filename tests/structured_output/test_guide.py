"""The per-request gate between the reasoning tracker and the grammar, driven token
by token on real vocabularies (Qwen3, o200k_harmony) and real xgrammar matchers."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from reasoning import Phase, create_reasoning_parser
from structured_output import GrammarSpec, LocalCompiler
from structured_output.guide import GuideError, RequestGuide

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "tag",
        "begin": {"type": "token", "token": "<tool_call>"},
        "content": {"type": "const_string", "value": "x"},
        "end": {"type": "token", "token": "</tool_call>"},
    },
}


@pytest.fixture(scope="module")
def grammars(qwen3):
    compiler = LocalCompiler(qwen3)
    return {
        "json": compiler.compile(GrammarSpec.of("json_schema", json.dumps(SCHEMA))),
        "tool": compiler.compile(GrammarSpec.of("structural_tag", json.dumps(TOOL_TAG))),
    }


def _guide(qwen3, grammar, *, prompt_text="<|im_start|>assistant\n", kwargs=None, budget=None):
    parser = create_reasoning_parser("qwen3", qwen3, kwargs)
    prompt = qwen3.encode(prompt_text)
    tracker = parser.tracker(prompt, parser.reasoning_ended(prompt))
    matcher = xgr.GrammarMatcher(grammar, override_stop_tokens=list(qwen3.stop_token_ids))
    return RequestGuide(
        tracker,
        matcher,
        implicit_end_ids=parser.implicit_end_ids,
        stop_token_ids=qwen3.stop_token_ids,
        budget=budget,
    )


def _feed(guide, ids):
    out = []
    for t in ids:
        out.append(t)
        guide.accept(t, out)
    return out


def test_layout_continuations(qwen3):
    parser = create_reasoning_parser("qwen3", qwen3)
    by_bytes = {t for t, b in enumerate(qwen3.all_token_bytes) if b in (b"\n", b"\n\n")}
    assert set(parser.layout_ids(b"\n\n")) == by_bytes >= {198, 271}
    assert set(parser.layout_ids(b"\n")) == {t for t in by_bytes if qwen3.token_bytes(t) == b"\n"}
    t = parser.new_tracker(Phase.THINKING)
    assert t.layout_continuations() == ()
    t.advance([qwen3.id_of("</think>")])
    assert t.in_layout and set(t.layout_continuations()) == by_bytes
    assert t.take_layout(198) and t.in_layout
    assert not t.take_layout(198 + 1) and not t.in_layout


def test_thinking_is_free_and_the_separator_is_not_fed(qwen3, grammars):
    g = _guide(qwen3, grammars["json"])
    assert g.phase == Phase.UNDECIDED and g.needs_mask
    assert qwen3.id_of("<think>") in g.extra_allowed()
    _feed(g, [qwen3.id_of("<think>")])
    assert g.thinking and not g.needs_mask
    _feed(g, qwen3.encode('{ "quotes" and } braces'))
    assert g.thinking
    _feed(g, [qwen3.id_of("</think>")])
    assert g.phase == Phase.ANSWER and g.needs_mask
    assert set(g.extra_allowed()) >= {198, 271}
    _feed(g, [271])  # "\n\n": the separator, not fed to the grammar
    assert g.extra_allowed() == ()
    _feed(g, qwen3.encode('{"a": 12}'))
    assert g.matcher.is_completed()
    _feed(g, [qwen3.eos_token_id])
    assert g.terminated


def test_undecided_tokens_are_tentative(qwen3, grammars):
    g = _guide(qwen3, grammars["json"])
    _feed(g, qwen3.encode('{"a": 1}'))
    assert g.phase == Phase.ANSWER
    assert g.matcher.is_completed()  # the first token was the answer's, and was kept


def test_implicit_end_and_stops_are_banned_only_where_the_grammar_rejects_them(qwen3, grammars):
    tool_call, stops = qwen3.id_of("<tool_call>"), set(qwen3.stop_token_ids)
    g_json = _guide(qwen3, grammars["json"])
    g_tool = _guide(qwen3, grammars["tool"])
    assert set(g_json.banned) == {tool_call} | stops
    assert set(g_tool.banned) == stops


def test_implicit_end_is_the_answers_first_token(qwen3, grammars):
    g = _guide(qwen3, grammars["tool"])
    _feed(g, [qwen3.id_of("<think>")] + qwen3.encode("let me call"))
    _feed(g, [qwen3.id_of("<tool_call>")])
    assert g.phase == Phase.ANSWER
    _feed(g, qwen3.encode("x") + [qwen3.id_of("</tool_call>")])
    assert g.matcher.is_completed()


def test_thinking_off_means_grammar_from_the_first_token(qwen3, grammars):
    g = _guide(
        qwen3,
        grammars["json"],
        prompt_text="<|im_start|>assistant\n<think>\n\n</think>\n\n",
        kwargs={"enable_thinking": False},
    )
    assert g.phase == Phase.ANSWER and g.needs_mask and g.extra_allowed() == ()
    with pytest.raises(GuideError):
        _feed(g, [271])


def test_budget_forces_the_end_marker(qwen3, grammars):
    g = _guide(qwen3, grammars["json"], budget=3)
    _feed(g, [qwen3.id_of("<think>")] + qwen3.encode(" one two"))
    assert g.forced_token() is None
    _feed(g, qwen3.encode(" three"))
    assert g.num_reasoning_tokens == 3
    assert g.forced_token() == qwen3.id_of("</think>")
    _feed(g, [qwen3.id_of("</think>")])
    assert g.phase == Phase.ANSWER and g.forced_token() is None


def test_rejected_token_is_an_error(qwen3, grammars):
    g = _guide(
        qwen3,
        grammars["json"],
        prompt_text="<|im_start|>assistant\n<think>\n\n</think>\n\n",
        kwargs={"enable_thinking": False},
    )
    with pytest.raises(GuideError, match="rejected"):
        _feed(g, qwen3.encode("hello"))


def test_half_a_separator_then_the_answer(qwen3, grammars):
    g = _guide(qwen3, grammars["json"])
    _feed(g, [qwen3.id_of("<think>")] + qwen3.encode("hm") + [qwen3.id_of("</think>")])
    _feed(g, [198])  # "\n": layout, one of two
    assert set(g.extra_allowed()) >= {198}
    _feed(g, qwen3.encode('{"a": 7}'))
    assert g.extra_allowed() == () and g.matcher.is_completed()


def test_a_token_only_the_opening_allows_leaves_the_grammar(qwen3, grammars):
    """olmo-style text markers on Qwen3's vocabulary: ``<`` may begin ``<think>`` but
    no JSON answer. The grammar is left (not killed): the mask is the opening's
    continuations alone until the thinking opens, and the grammar starts afresh."""
    p = create_reasoning_parser("granite", qwen3)
    tracker = p.new_tracker(Phase.UNDECIDED)
    matcher = xgr.GrammarMatcher(grammars["json"], override_stop_tokens=list(qwen3.stop_token_ids))
    g = RequestGuide(tracker, matcher, stop_token_ids=qwen3.stop_token_ids)
    here = qwen3.encode("Here")
    assert g.needs_mask and g.follows_grammar and set(here) <= set(g.extra_allowed())
    _feed(g, here)
    assert g.phase == Phase.UNDECIDED and g.needs_mask and not g.follows_grammar
    conts = set(g.extra_allowed())
    assert conts and all(
        p.start.is_proper_prefix(b"Here" + qwen3.token_bytes(t))
        or p.start.completed_by(b"Here" + qwen3.token_bytes(t))
        for t in conts
    )
    _feed(g, qwen3.encode(" is my thought process:"))
    assert g.thinking and not g.needs_mask and g.follows_grammar
    _feed(g, qwen3.encode(" x. Here is my response:"))
    assert g.phase == Phase.ANSWER and g.needs_mask and g.follows_grammar
    _feed(g, qwen3.encode('\n{"a": 1}'))  # "\n": the separator, not the grammar's
    assert g.matcher.is_completed()


HARMONY_PROMPT = "<|start|>user<|message|>Weather?<|end|><|start|>assistant"
ANSWER_SCHEMA = {"type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"]}


def test_harmony_may_think_under_a_framed_grammar(harmony):
    """The answer's grammar is Harmony's final-channel frame around a JSON schema: the
    ``a`` of ``analysis`` is no answer, yet the model may write it and think."""
    from frontend.tool_formats import create_tool_format

    fmt = create_tool_format("openai", harmony)
    spec = fmt.response_constraint(GrammarSpec.of("json_schema", json.dumps(ANSWER_SCHEMA)))
    grammar = LocalCompiler(harmony).compile(spec)
    parser = create_reasoning_parser("openai_gptoss", harmony)
    prompt = harmony.encode(HARMONY_PROMPT)
    tracker = parser.tracker(prompt, parser.reasoning_ended(prompt))
    matcher = xgr.GrammarMatcher(grammar, override_stop_tokens=list(harmony.stop_token_ids))
    g = RequestGuide(tracker, matcher, stop_token_ids=harmony.stop_token_ids)
    assert g.phase == Phase.UNDECIDED
    _feed(g, [harmony.id_of("<|channel|>")])  # the grammar's too
    assert g.follows_grammar
    a = harmony.encode("a")
    assert set(a) <= set(g.extra_allowed())
    _feed(g, a)
    assert g.needs_mask and not g.follows_grammar  # only "nalysis..." may follow
    _feed(g, harmony.encode("nalysis<|message|>Think.<|end|>"))
    assert g.phase == Phase.UNDECIDED and g.follows_grammar
    _feed(g, harmony.encode('<|start|>assistant<|channel|>final<|message|>{"c": 3}'))
    assert g.phase == Phase.ANSWER and g.matcher.is_completed()
    assert g.num_reasoning_tokens == len(harmony.encode("Think."))
