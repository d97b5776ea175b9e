"""Jump forward over a marker: forced text stops before a token-level element (a
family's marker), and the end of forced text is held back in case what follows merges
with it. Where the grammar then allows one marker alone, nothing can merge across it:
the held-back text and the marker are appended too. A token that ends the grammar is
never jumped (the stop is the model's own step). Real vocabulary, real matchers."""

from __future__ import annotations

import xgrammar as xgr

from frontend.tool_formats import FunctionTool, create_tool_format
from structured_output import GrammarSpec, LocalCompiler
from structured_output.guide import RequestGuide
from structured_output.jump_forward import ForcedTokens

TOOL = FunctionTool(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    },
)


def _setup(qwen3, family: str):
    spec = create_tool_format(family, qwen3).constraint([TOOL], named=TOOL.name, parallel=False)
    grammar = LocalCompiler(qwen3).compile(GrammarSpec.of(spec.kind.value, spec.value))
    matcher = xgr.GrammarMatcher(grammar, override_stop_tokens=list(qwen3.stop_token_ids))
    guide = RequestGuide(None, matcher, stop_token_ids=qwen3.stop_token_ids)
    forced = ForcedTokens(
        lambda s: qwen3.encode(s, special=False),
        qwen3.all_token_bytes,
        qwen3.vocab_rows,
        qwen3.special_ids,
    )
    return guide, forced


def _feed(guide, ids):
    out: list[int] = []
    for t in ids:
        out.append(t)
        guide.accept(t, out)
    return out


def test_the_text_before_a_lone_marker_and_the_marker_are_jumped(qwen3):
    guide, forced = _setup(qwen3, "qwen3_coder")
    # the call up to the end of the city's value: a parameter may follow, or the end
    head = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    _feed(guide, qwen3.encode(head))
    assert guide.jump_forward(forced, 64) == []  # "<parameter=unit>" or "</function>"
    # after "</function>" only "\n" and the end marker may come: both are jumped
    _feed(guide, qwen3.encode("</function>", special=False))
    jumped = guide.jump_forward(forced, 64)
    assert qwen3.decode(jumped) == "\n</tool_call>"
    assert jumped[-1] in qwen3.special_ids
    # the end of the output is the model's: the stop token is never jumped
    assert guide.jump_forward(forced, 64) == []
    assert not guide.matcher.is_terminated()


def test_a_marker_at_the_answers_start_is_jumped_with_the_text_after_it(qwen3):
    guide, forced = _setup(qwen3, "qwen3_coder")
    jumped = guide.jump_forward(forced, 64)
    text = qwen3.decode(jumped)
    assert jumped[0] == qwen3.special_tokens["<tool_call>"]
    assert text.startswith("<tool_call>\n<function=get_weather>")
    # the same from the tokenizer's own encoding of the whole call
    whole = qwen3.encode("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis")
    assert whole[: len(jumped)] == jumped


def test_the_limit_holds_over_markers(qwen3):
    guide, forced = _setup(qwen3, "qwen3_coder")
    assert len(guide.jump_forward(forced, 1)) == 1
    guide2, _ = _setup(qwen3, "qwen3_coder")
    assert guide2.jump_forward(forced, 0) == []
