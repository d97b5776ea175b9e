"""Jump forward over a marker: forced text stops before a token-level element (a
family's marker), and the end of forced text is held back in case what follows merges
with it. Where the grammar then allows one marker alone, nothing can merge across it:
the held-back text and the marker are appended too. A token that ends the grammar is
never jumped (the stop is the model's own step). The one-row mask that finds a lone
marker is filled only where a token the grammar names (read once per grammar) is
acceptable: over whole calls every fill finds its marker, a marker after sampled text
is found, and over every family's random outputs no marker the grammar allows is
missing from its names. Real vocabularies, real matchers."""

from __future__ import annotations

import json
import random
import zlib

import numpy as np
import pytest
import xgrammar as xgr

from frontend.tool_formats import FunctionTool, create_tool_format
from structured_output import GrammarSpec, LocalCompiler
from structured_output.guide import RequestGuide
from structured_output.jump_forward import ForcedTokens
from tests.support.constrained_sampler import free_text_ends
from tests.support.toolsets import tool_sets
from tests.tool_formats.conftest import FAMILIES, format_for, sampler_for, tokenizer_for
from tests.tool_formats.examples import EXAMPLES

TOOL = FunctionTool(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    },
)


def _setup(
    qwen3, family: str, *, named: str | None = TOOL.name, parallel=False, tokens=ForcedTokens
):
    """A guide of the family's call constraint, and the jump's view of the vocabulary
    (``tokens``: `ForcedTokens` or a subclass)."""
    spec = create_tool_format(family, qwen3).constraint([TOOL], named=named, parallel=parallel)
    grammar = LocalCompiler(qwen3).compile(GrammarSpec.of(spec.kind.value, spec.value))
    matcher = xgr.GrammarMatcher(grammar, override_stop_tokens=list(qwen3.stop_token_ids))
    guide = RequestGuide(
        None, matcher, stop_token_ids=qwen3.stop_token_ids, token_ids=grammar.token_ids
    )
    forced = tokens(
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


# ----- where a lone token is looked for -----------------------------------------------


def test_a_marker_after_sampled_text_is_jumped(qwen3):
    # the model wrote the object's end itself: the end marker, alone allowed, follows
    head = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n'
    ids = qwen3.encode(head)
    assert qwen3.decode(ids[-1:]) == '"}}\n'  # one token: no jump came before it
    guide, forced = _setup(qwen3, "hermes")
    _feed(guide, ids)
    assert guide.jump_forward(forced, 64) == [qwen3.special_tokens["</tool_call>"]]


class _CountingForced(ForcedTokens):
    """`ForcedTokens` that counts its one-row mask fills and the tokens they found."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fills = 0
        self.found = 0

    def single_allowed(self, matcher):
        self.fills += 1
        t = super().single_allowed(matcher)
        self.found += t is not None
        return t


@pytest.mark.parametrize("family", ["hermes", "qwen3_coder"])
@pytest.mark.parametrize("named", [TOOL.name, None])
def test_a_mask_is_filled_only_where_a_token_the_grammar_names_may_come(qwen3, family, named):
    """Over whole calls (two where the grammar allows several), the model writing what
    is not jumped: each fill finds the lone
    token it looks for (no fill is spent on a held-back jump that no marker follows),
    and the jumps are the call's own tokens."""
    guide, forced = _setup(qwen3, family, named=named, parallel=True, tokens=_CountingForced)
    call = (
        EXAMPLES[family][0 if named is None else 1]
        .replace("get_time", "get_weather")
        .replace('"tz"', '"city"')
    )
    call = call.replace("<parameter=tz>", "<parameter=city>")
    ids = qwen3.encode(call)
    out: list[int] = guide.jump_forward(forced, 256)
    jumped = len(out)
    while len(out) < len(ids):
        out.append(ids[len(out)])
        guide.accept(out[-1], out)
        step = guide.jump_forward(forced, 256)
        assert ids[len(out) : len(out) + len(step)] == step, qwen3.decode(out)
        out += step
        jumped += len(step)
    assert jumped > 0
    assert forced.fills == forced.found > 0
    markers = [t for t in ids if t in qwen3.special_ids]
    assert forced.found <= len(markers)


def test_the_grammar_names_its_markers_and_none_where_any_token_may_come(qwen3):
    compiler = LocalCompiler(qwen3)
    spec = create_tool_format("hermes", qwen3).constraint([TOOL], named=None, parallel=True)
    grammar = compiler.compile(GrammarSpec.of(spec.kind.value, spec.value))
    marks = {qwen3.special_tokens[m] for m in ("<tool_call>", "</tool_call>")}
    assert set(grammar.token_ids) == marks
    schema = compiler.compile(GrammarSpec.of("json_schema", json.dumps(TOOL.schema)))
    assert schema.token_ids == ()
    free = {
        "type": "sequence",
        "elements": [
            {"type": "token", "token": "<tool_call>"},
            {"type": "any_tokens", "exclude_tokens": ["</tool_call>"]},
            {"type": "token", "token": "</tool_call>"},
        ],
    }
    assert compiler.compile(GrammarSpec.of("structural_tag", json.dumps(free))).token_ids is None


@pytest.mark.parametrize("family", FAMILIES)
def test_every_marker_a_grammar_accepts_is_one_it_names(family):
    """Over every family, random tool sets, calls named and "required": along random
    outputs of the grammar (the adversarial sampler), each of the family's markers the
    grammar allows next, and any special token it allows alone, is among the ids the
    grammar names, so the cheap test before a mask fill misses no lone marker. (A free
    text that may hold any bytes may also take other special tokens as text: never
    alone.)"""
    tok, fmt = tokenizer_for(family), format_for(family)
    sampler = sampler_for(tok)
    stops = set(tok.stop_token_ids)
    markers = np.zeros(sampler.rows, dtype=bool)
    specials = np.zeros(sampler.rows, dtype=bool)
    markers[[tok.special_tokens[m] for m in fmt.special_markers]] = True
    specials[[t for t in tok.special_ids if t < sampler.rows]] = True
    going = np.ones(sampler.rows, dtype=bool)
    markers[list(stops)] = specials[list(stops)] = going[list(stops)] = False
    seed = zlib.crc32(family.encode())
    seen = 0
    for k, tools in enumerate(tool_sets(seed, 1)):
        rng = random.Random(seed + k)
        for named in (None, rng.choice(tools).name):
            spec = fmt.constraint(tools, named=named, parallel=True)
            grammar = sampler.compile(GrammarSpec.of(spec.kind.value, spec.value))
            names = grammar.token_ids
            assert names is not None, "our families name every token their grammar takes"
            ends = free_text_ends(spec)
            for _ in range(2):
                gen = sampler.generate(grammar, rng, max_tokens=160, free_text_ends=ends)
                matcher = sampler.matcher(grammar)
                for t in [None, *gen.token_ids]:
                    if t is not None:
                        assert matcher.accept_token(t)
                    allowed = sampler.allowed(matcher)
                    marks = set(allowed[markers[allowed]].tolist())
                    lone = allowed[going[allowed]]
                    if lone.size == 1 and specials[lone[0]]:
                        marks.add(int(lone[0]))
                    assert marks <= set(names), (tok.decode(gen.token_ids), marks - set(names))
                    seen += len(marks)
    assert seen > 0 if fmt.special_markers else names == ()
