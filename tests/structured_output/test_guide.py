"""The per-request gate between the reasoning tracker and the grammar, driven token
by token on the real Qwen3 vocabulary and real xgrammar matchers."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from reasoning import Phase, create_reasoning_parser
from structured_output import GrammarSpec, LocalCompiler
from structured_output.guide import GuideError, RequestGuide, SeparatorTable

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
        separator=SeparatorTable(parser.content_separator, qwen3.all_token_bytes),
        implicit_end_ids=parser.implicit_end_ids,
        stop_token_ids=qwen3.stop_token_ids,
        budget=budget,
        token_bytes=qwen3.all_token_bytes,
    )


def _feed(guide, ids):
    out = []
    for t in ids:
        out.append(t)
        guide.accept(t, out)
    return out


def test_separator_table(qwen3):
    table = SeparatorTable(b"\n\n", qwen3.all_token_bytes)
    assert set(table.allowed(b"\n\n")) >= {198, 271}
    assert 271 not in table.allowed(b"\n") and 198 in table.allowed(b"\n")
    assert all(qwen3.token_bytes(t) in (b"\n", b"\n\n") for t in table.allowed(b"\n\n"))


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
