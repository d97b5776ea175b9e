"""Drafts (``--draft-tokens K``): prompt-lookup tokens scored in the step's one forward
pass and kept only where the model's sampling, under the request's constraints, chose
them.

- The draft source: over random token sequences grown step by step, its draft is the
  continuation of the most recent earlier occurrence of the longest suffix (n = 3..1),
  as a plain search over the whole sequence finds it.
- Greedy, scripted model writing each family's example call and one answer per spec
  kind, after a thought where the vocabulary has one: the output is token for token the
  same with and without drafts, parses the same with jump forward on too, is valid, its
  stream parses as its whole, and drafts were kept (fewer steps).
- A draft source that proposes what the model would write without a mask: the thought,
  the end marker, then text the grammar rejects. Not one rejected token is kept: the
  output is the one written without drafts, valid; after every step each guide's state
  (its tracker's phase and count, its matcher's next-token mask) is that of a guide fed
  the output afresh.
- Random model, seeded sampling: the output is token for token the one without drafts
  (the acceptance rule draws as plain sampling does), valid where it stopped, and its
  stream parses as its whole.
- A Hugging Face model (float64): greedy outputs with drafts are those without, with
  drafts both kept and rejected (the key-value cache rolled back).
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import time
import zlib

import jsonschema
import pytest
import torch
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_core.config import EngineConfig
from engine_core.drafts import MAX_N, MAX_WAIT, NgramIndex
from engine_core.engine import EngineCore, _grammar_of
from frontend.tool_formats import create_tool_format
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output import GrammarSpec
from structured_output.config import StructuredOutputConfig
from tests.engine.test_jump_forward import (
    BASES,
    SCHEMA,
    THOUGHT,
    _cases,
    _check_output,
    _core,
    _drain,
    _ending_texts,
    _markers,
    _prompt,
    _stream_cuts,
)
from tests.support.roundtrip import call_errors, same_output, stream_parse
from tests.support.toolsets import tool_sets
from tokenization import load_tokenizer

K = 4

# ----- the draft source -----------------------------------------------------------------


def _reference(seq: list[int], k: int) -> list[int]:
    """The draft by a plain search of the whole sequence."""
    total = len(seq)
    for n in range(min(MAX_N, total), 0, -1):
        for e in range(total - 1, n - 1, -1):
            if seq[e - n : e] == seq[total - n :]:
                return seq[e : e + k]
    return []


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 4), max_size=12),
    chunks=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=4), max_size=10),
    k=st.integers(0, 5),
)
def test_the_draft_follows_the_latest_earlier_match_of_the_longest_suffix(prompt, chunks, k):
    index = NgramIndex(prompt)
    out: list[int] = []
    assert index.lookup(out, k) == _reference(prompt, k)
    for c in chunks:
        out += c
        assert index.lookup(out, k) == _reference(prompt + out, k)


def test_a_request_whose_drafts_fail_waits_longer_and_a_kept_one_ends_the_wait():
    index = NgramIndex(list(range(10)) * 2)  # every token has an earlier occurrence
    out: list[int] = []
    drafted: list[int] = []  # the steps that got a draft
    for step in range(80):
        d = index.propose(out, 4)
        assert d or index.lookup(out, 4)  # no draft: a wait, not a miss
        if d:
            drafted.append(step)
        keep = step >= 70  # the model rejects every draft, then takes each
        out.append(d[0] if d and keep else ((d[0] + 1) % 10 if d else 3))
    gaps = [b - a for a, b in zip(drafted, drafted[1:], strict=False)]
    first = [2, 3, 5, 9, MAX_WAIT + 1, MAX_WAIT + 1]
    assert gaps[: len(first)] == first
    assert gaps[-5:] == [1] * 5


# ----- scripted and greedy, every family and spec kind -----------------------------------

CITY = '"city=" [a-z]+ ";"'
#: one answer per spec kind beside the tool calls: (tag, spec, answer, check)
KIND_CASES = [
    ("[kind-json_schema]", GrammarSpec.of("json_schema", json.dumps(SCHEMA)),
     '{"city": "Paris", "days": 3}', lambda s: jsonschema.validate(json.loads(s), SCHEMA) is None),
    ("[kind-json_object]", GrammarSpec.of("json_object"),
     '{"city": "Paris", "country": "France", "city2": "Paris"}',
     lambda s: isinstance(json.loads(s), dict)),
    ("[kind-regex]", GrammarSpec.of("regex", r"(yes|no), [a-z]+ [a-z]+ [0-9]{1,3}"),
     "yes, paris paris 42", lambda s: re.fullmatch(r"(yes|no), [a-z]+ [a-z]+ [0-9]{1,3}", s)),
    ("[kind-choice]", GrammarSpec.of("choice", json.dumps(["Paris, Paris", "London"])),
     "Paris, Paris", lambda s: s in ("Paris, Paris", "London")),
    ("[kind-grammar]", GrammarSpec.of("grammar", f"root ::= {CITY} ({CITY})*"),
     "city=paris;city=paris;", lambda s: re.fullmatch(r"(city=[a-z]+;)+", s)),
]  # fmt: skip

#: the families the default run covers; the slow run covers every family of the base
QUICK = ("hermes",)


def _all_cases(base: str, quick: bool):
    """(tag, family or None, named, parallel, spec, script output, check or None)."""
    thought = THOUGHT if base == "qwen3" else ""
    for tag, fam, named, parallel, spec, text in _cases(base):
        if fam is None or (quick and fam not in QUICK):
            continue  # the JSON answer is a spec kind below
        yield tag, fam, named, parallel, spec, text, None
    for tag, spec, answer, check in KIND_CASES[: 1 if quick else None]:
        yield tag, None, None, False, spec, thought + answer, check


def _engine(tmp_path, base: str, cases, *, model: str, jump=False, drafts=0, **own):
    script = [(c[0], c[5]) for c in cases]
    return _core(tmp_path, base, model=model, jump=jump, drafts=drafts, script=script, **own)


#: what the model means to write after the end marker: no family's call, no spec's answer
JUNK = "Sure! I will not call anything: {'city': Paris} <<done>>"


def _junk_cases(base: str, quick: bool):
    """The cases whose script writes `JUNK` after the thought, under tags of their own."""
    thought = THOUGHT if base == "qwen3" else ""
    return [("[junk-" + c[0][1:], *c[1:5], thought + JUNK, c[6]) for c in _all_cases(base, quick)]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """``scripted(base, drafts, jump)``: the scripted engine of this module for that
    base, draft count and jump forward, made on first use and shared by the tests (its
    script holds every case of the base, the `JUNK` ones under their own tags; each
    test runs its requests to the end, puts back any drafter it swaps in, and seeds its
    requests: an unseeded request takes its model seed from the engine's generator,
    which every earlier request has moved on)."""
    made: dict[tuple[str, int, bool], EngineCore] = {}

    def get(base: str, drafts: int, jump: bool = False) -> EngineCore:
        key = (base, drafts, jump)
        if key not in made:
            cases = [*_all_cases(base, quick=False), *_junk_cases(base, quick=False)]
            path = tmp_path_factory.mktemp("scripted")
            made[key] = _engine(path, base, cases, model="scripted", jump=jump, drafts=drafts)
        return made[key]

    yield get
    for core in made.values():
        core.close()


@contextlib.contextmanager
def _drafter(core: EngineCore, drafter):
    """``core`` proposing its drafts with ``drafter`` (None: its own) for the block."""
    own = core.drafter
    core.drafter = drafter or own
    try:
        yield core
    finally:
        core.drafter = own


def _submit(core: EngineCore, cases, thinking: bool, max_tokens=160, **sampling) -> None:
    tok = core.tokenizer
    for i, (tag, *_, spec, _text, _check) in enumerate(cases):
        sp = SamplingParams(max_tokens=max_tokens, **sampling)
        if "seed" in sampling:
            sp = SamplingParams(max_tokens=max_tokens, **{**sampling, "seed": sampling["seed"] + i})
        req = EngineCoreRequest(
            tag,
            _prompt(tok, tag, thinking),
            sp,
            StructuredOutputSpec(spec.kind.value, spec.value),
            reasoning_ended=False if thinking else None,
        )
        assert core.add_request(b"t", req) == []


def _checked(tok, case, outputs, thinking: bool):
    """The output's ids and its parsed answer (tool calls) or text (spec kinds), after
    checking they are valid."""
    tag, fam, named, parallel, spec, _, check = case
    if fam is not None:
        return _check_output(tok, (tag, fam, named, parallel, spec, None), outputs, thinking)
    finals = [o for o in outputs if o.finished]
    assert len(finals) == 1 and finals[0].finish_reason == FinishReason.STOP, (tag, finals)
    ids = [t for o in outputs for t in o.new_token_ids]
    text = tok.decode(ids[:-1])
    if thinking:
        text = text[text.index("</think>") + len("</think>") :].lstrip("\n")
    assert check(text), (tag, text)
    return ids, text


def _same(a, b) -> bool:
    return a == b if isinstance(a, str) else same_output(a, b, compare_ids=False)


@pytest.mark.parametrize(
    "base,quick",
    [
        ("qwen3", True),
        pytest.param("qwen3", False, marks=pytest.mark.slow),
        pytest.param("llama3", False, marks=pytest.mark.slow),
        pytest.param("o200k_harmony", False, marks=pytest.mark.slow),
    ],
)
def test_greedy_outputs_are_the_same_with_and_without_drafts(base, quick, scripted):
    cases = list(_all_cases(base, quick))
    thinking = base == "qwen3"
    runs = {}
    for jump, drafts in ((False, 0), (False, K), (True, K)):
        core = scripted(base, drafts, jump)
        accepted = core.num_accepted_drafts
        _submit(core, cases, thinking, temperature=0.0, seed=0)
        got = _drain(core)
        if drafts:
            assert core.num_accepted_drafts > accepted
        # per case: ids, parsed answer, and the steps it took (one output per step)
        runs[jump, drafts] = {
            c[0]: (*_checked(core.tokenizer, c, got[c[0]], thinking), len(got[c[0]])) for c in cases
        }
    plain, drafted, both = runs[False, 0], runs[False, K], runs[True, K]
    for tag, (ids, parsed, steps) in plain.items():
        assert drafted[tag][0] == ids, tag
        assert _same(both[tag][1], parsed), tag
        assert drafted[tag][2] <= steps, tag  # a step takes one token or more
    assert sum(d[2] for d in drafted.values()) < sum(p[2] for p in plain.values())


# ----- a draft source that proposes what the grammar rejects --------------------------------


class UnmaskedDrafter:
    """Proposes the scripted model's own next tokens: what it writes without a mask.
    After the end of thinking, the script's text is one its grammar rejects."""

    def __init__(self, runner, k: int) -> None:
        self.runner, self.k = runner, k
        #: drafts proposed that cross the end marker into the answer
        self.crossing = 0

    def propose(self, r, k: int) -> list[int]:
        script = self.runner.script_for(r.prompt_token_ids)
        n = len(r.output_ids)
        d = script[n : n + min(k, self.k)]
        end = self.runner.tokenizer.special_tokens.get("</think>")
        if end in d[:-1]:
            self.crossing += 1
        return d


class OracleDrafter:
    """Proposes the scripted model's own script, then its end of sequence, then the
    script again (tokens past a stop that must never be appended)."""

    def __init__(self, runner, k: int) -> None:
        self.runner, self.k = runner, k

    def propose(self, r, k: int) -> list[int]:
        script = self.runner.script_for(r.prompt_token_ids)
        n = len(r.output_ids)
        return (script + [self.runner.tokenizer.eos_token_id] + script)[n : n + min(k, self.k)]


def test_stops_and_max_tokens_inside_kept_drafts_end_the_output_there(scripted):
    cases = list(_all_cases("qwen3", quick=True))
    runs = {}
    for drafts in (0, 6):
        core = scripted("qwen3", drafts)
        accepted = core.num_accepted_drafts
        with _drafter(core, OracleDrafter(core.runner, drafts) if drafts else None):
            tok = core.tokenizer
            for tag, *_, spec, _text, _check in cases:
                for max_tokens in (160, 23, 41):
                    req = EngineCoreRequest(
                        f"{tag}#{max_tokens}",
                        _prompt(tok, tag, True),
                        SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=max_tokens),
                        StructuredOutputSpec(spec.kind.value, spec.value),
                        reasoning_ended=False,
                    )
                    assert core.add_request(b"t", req) == []
            runs[drafts] = _drain(core)
            if drafts:
                assert core.num_accepted_drafts > accepted
    for rid, outputs in runs[6].items():
        ids = [t for o in outputs for t in o.new_token_ids]
        assert ids == [t for o in runs[0][rid] for t in o.new_token_ids], rid
        final = outputs[-1]
        limit = int(rid.rsplit("#", 1)[1])
        assert len(ids) <= limit
        if final.finish_reason == FinishReason.STOP:
            assert ids[-1] == tok.eos_token_id and ids.count(tok.eos_token_id) == 1, rid
        else:
            assert final.finish_reason == FinishReason.LENGTH and len(ids) == limit, rid


def _fresh_guide(core: EngineCore, r):
    g = core.structured_output.make_guide(
        _grammar_of(r.grammar),
        prompt_token_ids=r.prompt_token_ids,
        reasoning_ended=r.reasoning_ended,
        reasoning_kwargs=r.reasoning_kwargs,
        reasoning_budget=r.reasoning_budget,
        stop_token_ids=r.grammar_stop_ids,
    )
    for i, t in enumerate(r.output_ids):
        g.accept(t, r.output_ids[: i + 1])
    return g


def _guide_state(g, vocab_rows: int):
    mask = None
    if g.matcher is not None:
        bm = xgr.allocate_token_bitmask(1, vocab_rows)
        g.matcher.fill_next_token_bitmask(bm)
        mask = bm.clone()
    return (
        g.phase,
        g.num_reasoning_tokens,
        g.needs_mask,
        g.follows_grammar,
        tuple(g.extra_allowed()),
        g.terminated,
        mask,
    )


def _drain_checking_guides(core: EngineCore) -> dict[str, list]:
    """`_drain`, and after each step every running guide is compared with a guide fed
    the request's output afresh (its last token fed now, as the next step would)."""
    got: dict[str, list] = {}
    deadline = time.monotonic() + 600
    while core.has_work:
        assert time.monotonic() < deadline
        if not core.has_runnable:
            time.sleep(0.01)
        for _, o in core.step():
            got.setdefault(o.request_id, []).append(o)
        for r in core.running:
            if r.status != 1 or r.guide is None:  # RUNNING
                continue
            tok, r.pending = r.pending, None
            if tok is not None:
                r.guide.accept(tok, r.output_ids)
            live = _guide_state(r.guide, core.vocab_rows)
            fresh = _guide_state(_fresh_guide(core, r), core.vocab_rows)
            assert live[:-1] == fresh[:-1], r.request_id
            assert (live[-1] is None) == (fresh[-1] is None)
            assert live[-1] is None or torch.equal(live[-1], fresh[-1]), r.request_id
    return got


@pytest.mark.parametrize(
    "base,quick",
    [
        ("qwen3", True),
        pytest.param("qwen3", False, marks=pytest.mark.slow),
        pytest.param("llama3", False, marks=pytest.mark.slow),
    ],
)
def test_drafts_the_grammar_rejects_after_the_end_marker_are_never_kept(base, quick, scripted):
    thinking = base == "qwen3"
    cases = _junk_cases(base, quick)
    runs = {}
    for drafts in (0, 6):
        core = scripted(base, drafts)
        accepted = core.num_accepted_drafts
        with _drafter(core, UnmaskedDrafter(core.runner, drafts) if drafts else None):
            _submit(core, cases, thinking, max_tokens=96, temperature=0.0, seed=0)
            got = _drain_checking_guides(core)
            if drafts:
                assert core.num_accepted_drafts > accepted
                assert core.drafter.crossing > 0 or not thinking
        runs[drafts] = got
    tok = core.tokenizer
    for c in cases:
        tag = c[0]
        ids = [t for o in runs[6][tag] for t in o.new_token_ids]
        assert ids == [t for o in runs[0][tag] for t in o.new_token_ids], tag
        final = runs[6][tag][-1]
        assert final.error is None, (tag, final.error)
        if thinking:
            assert JUNK[:6] not in tok.decode(ids), tag
        if final.finish_reason == FinishReason.STOP:
            _checked(tok, c, runs[6][tag], thinking)


# ----- random model, seeded sampling ------------------------------------------------------


@pytest.mark.parametrize(
    "base,quick",
    [
        ("qwen3", True),
        pytest.param("qwen3", False, marks=pytest.mark.slow),
        pytest.param("llama3", False, marks=pytest.mark.slow),
        pytest.param("o200k_harmony", False, marks=pytest.mark.slow),
    ],
)
def test_seeded_random_outputs_are_the_same_with_drafts_valid_and_streamed_as_whole(
    base, quick, tmp_path
):
    tok = load_tokenizer(base).with_special_tokens(_markers(base))
    cases = []
    for fam in BASES[base]:
        if quick and fam not in QUICK:
            continue
        fmt = create_tool_format(fam, tok)
        seed = zlib.crc32(fam.encode())
        for k, tools in enumerate(tool_sets(seed, 1 if quick else 2)):
            named = random.Random(seed + k).choice(tools).name
            for nm, parallel in ((None, True), (named, False)):
                spec = fmt.constraint(tools, named=nm, parallel=parallel)
                cases.append((f"{fam}-{k}-{nm}-{parallel}", fam, nm, parallel, spec, tools))
    runs = {}
    for drafts in (0, K):
        core = _engine(
            tmp_path, base, [], model="random", drafts=drafts, ending_texts=_ending_texts(base, tok)
        )
        try:
            for i, (tag, *_, spec, _tools) in enumerate(cases):
                req = EngineCoreRequest(
                    tag,
                    tok.encode("Call the right tool, with the arguments of the last call."),
                    SamplingParams(max_tokens=256, seed=i),
                    StructuredOutputSpec(spec.kind.value, spec.value),
                )
                assert core.add_request(b"t", req) == []
            runs[drafts] = _drain(core)
            if drafts:
                assert core.num_draft_tokens > 0
        finally:
            core.close()
    stopped = 0
    for tag, fam, named, parallel, _, tools in cases:
        outputs = runs[K][tag]
        ids = [t for o in outputs for t in o.new_token_ids]
        assert ids == [t for o in runs[0][tag] for t in o.new_token_ids], tag
        final = outputs[-1]
        assert final.error is None, (tag, final.error)
        if final.finish_reason != FinishReason.STOP:
            continue
        stopped += 1
        text = tok.decode(ids[:-1])
        fmt = create_tool_format(fam, tok)
        whole = fmt.parse(text, tools, named=named)
        cuts = [c for c in _stream_cuts(tok, outputs, 0) if c < len(text)]
        assert call_errors(whole, tools, named, parallel) == [], (tag, text)
        streamed = stream_parse(fmt, text, tools, cuts, named)
        assert same_output(whole, streamed, compare_ids=fam == "kimi_k2"), (tag, text)
    assert stopped >= 0.6 * len(cases)


# ----- a Hugging Face model ---------------------------------------------------------------


def test_hf_greedy_outputs_are_the_same_with_drafts(tmp_path):
    from tests.support.tiny_model import build_model

    path = build_model(tmp_path / "model", "qwen3", seed=1)
    tok = load_tokenizer("qwen3")
    prompts = [
        "<|im_start|>user\nRepeat: a b c a b c a b c a b c<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nThe city is Paris, the city is Paris.<|im_end|>\n",
        "one two three one two three one two",
    ]
    runs = {}
    for drafts in (0, K):
        config = EngineConfig(
            model=str(path),
            tokenizer="qwen3",
            dtype="float64",
            max_num_seqs=4,
            draft_tokens=drafts,
            reasoning_parser="qwen3",
            structured_output=StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
        )
        core = EngineCore(config, tok)
        try:
            for i, p in enumerate(prompts):
                spec = GrammarSpec.of("json_schema", json.dumps(SCHEMA)) if i == 1 else None
                req = EngineCoreRequest(
                    f"r{i}",
                    tok.encode(p),
                    SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=spec is None),
                    StructuredOutputSpec(spec.kind.value, spec.value) if spec else None,
                    reasoning_ended=True if spec else None,
                )
                assert core.add_request(b"t", req) == []
            got = _drain(core)
            runs[drafts] = {k: [t for o in v for t in o.new_token_ids] for k, v in got.items()}
            if drafts:
                assert 0 < core.num_accepted_drafts < core.num_draft_tokens
        finally:
            core.close()
    assert runs[K] == runs[0]


# ----- the flag ----------------------------------------------------------------------------


def test_the_flag_sets_draft_tokens_and_a_negative_count_is_refused():
    import argparse

    from engine_core.config import add_engine_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert config_from_args(parser.parse_args([])).draft_tokens == 0
    config = config_from_args(parser.parse_args(["--draft-tokens", "5"]))
    assert config.draft_tokens == 5 and "--draft-tokens=5" in config.to_args()
    with pytest.raises(ValueError, match="--draft-tokens -1: must be 0 or more"):
        EngineCore(EngineConfig(draft_tokens=-1), load_tokenizer("qwen3"))
