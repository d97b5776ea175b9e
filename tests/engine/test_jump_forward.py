"""Jump forward: the text a grammar forces is appended without sampling, split as the
model's tokenizer splits it.

- The split: over every bundled vocabulary, for forced texts and continuations drawn
  from the pieces of JSON, XML-style and Python-style calls, the tokens kept are the
  first tokens of the whole text's own encoding, whatever follows.
- Greedy, with the scripted model writing each family's example call (named and
  "required", one call and parallel calls; and a JSON-schema answer), after a thought
  where the family's vocabulary has one: the output is token for token the same with
  and without jump forward, it parses to valid calls, the stream cut where the engine
  cut it parses the same as the whole, and with jump forward the named calls take
  fewer steps.
- With the random model (every step adversarial) and jump forward on, over random
  tool sets: every output that ends is valid and its stream equals its whole.
- An answer that begins at once under its grammar: its forced start is appended before
  the first forward pass (the first output holds it, the output is the same as
  without jump forward); nothing is while the model may think first. With a Hugging
  Face model whose prompts are prefilled in chunks while their outputs hold such a
  start, drafts on: the outputs of a one-pass prefill without drafts.
"""

from __future__ import annotations

import functools
import json
import random
import time
import zlib

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_core.config import EngineConfig
from engine_core.engine import EngineCore
from frontend.tool_formats import FunctionTool, ToolFormat, create_tool_format
from frontend.tool_formats import get_tool_format_class as format_class
from frontend.tool_formats.json_schema import JsonSchemaToolFormat
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output import GrammarSpec
from structured_output.config import StructuredOutputConfig
from structured_output.jump_forward import ForcedTokens
from tests.support.constrained_sampler import free_text_ends
from tests.support.roundtrip import call_errors, same_output, stream_parse
from tests.support.toolsets import tool_sets
from tests.tool_formats.conftest import EXAMPLE_TOOLS, FAMILIES, VOCABS, vocab_for
from tests.tool_formats.examples import EXAMPLES
from tokenization import load_tokenizer

# ----- the split ----------------------------------------------------------------------

PIECES = [
    *"{}[]():,.\"=<>/\\_-$@#'`*+|!?;&%",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "\u00a0",
    "name",
    "arguments",
    "get",
    "_weather",
    "city",
    "Paris",
    "parameter",
    "function",
    "true",
    "null",
    "CET",
    "s",
    "t",
    "don",
    "Hello",
    " world",
    "ABC",
    "x",
    "0",
    "12",
    "345",
    "1.5e3",
    "é",
    "été",
    "日本語",
    "Ωμέγα",
    "\\n",
    "\\u00e9",
    "🙂",
]
texts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=8).map("".join)


@functools.cache
def _forced(vocab: str) -> tuple[ForcedTokens, object]:
    tok = load_tokenizer(vocab)
    return ForcedTokens(lambda s: tok.encode(s, special=False), tok.all_token_bytes), tok


@pytest.mark.parametrize("vocab", [*VOCABS, "cl100k_base"])
@settings(max_examples=400, deadline=None)
@given(forced=texts, after=texts)
def test_the_jump_is_the_start_of_the_tokenizers_own_split(vocab, forced, after):
    f, tok = _forced(vocab)
    ids = f(forced)
    assert tok.encode(forced + after, special=False)[: len(ids)] == ids
    assert tok.decode_bytes(ids) == forced.encode()[: len(tok.decode_bytes(ids))]


def test_a_jump_keeps_whole_words_before_the_last_chunk():
    f, tok = _forced("qwen3")
    assert tok.decode(f('get_weather"')) == "get_weather"
    assert tok.decode(f('{"name": "get_weather", "arguments": {"')) == (
        '{"name": "get_weather", "arguments":'
    )
    assert f("{") == [] and f("") == []


# ----- the engine, scripted and greedy ----------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
JSON_ANSWER = '{"city": "Paris", "days": 3}'
THOUGHT = "<think>\nThe user wants the weather in Paris.\n</think>\n\n"
#: base vocabulary -> the families tested on it
BASES: dict[str, list[str]] = {v: [f for f in FAMILIES if vocab_for(f) == v] for v in VOCABS}


def _markers(base: str) -> list[str]:
    out = [m for f in BASES[base] for m in format_class(f).special_markers]
    return list(dict.fromkeys(out))


def _cases(base: str):
    """(tag, family or None, named, parallel, spec, script output)."""
    thought = THOUGHT if base == "qwen3" else ""
    tok = load_tokenizer(base).with_special_tokens(_markers(base))
    for fam in BASES[base]:
        fmt = create_tool_format(fam, tok)
        both, one = EXAMPLES[fam]
        for named, parallel, text in (
            ("get_weather", False, one),
            (None, False, one),
            (None, True, both),
        ):
            spec = fmt.constraint(EXAMPLE_TOOLS, named=named, parallel=parallel)
            tag = f"[{fam}-{named}-{parallel}]"
            yield tag, fam, named, parallel, spec, thought + text
    if base == "qwen3":
        spec = GrammarSpec.of("json_schema", json.dumps(SCHEMA))
        yield "[json-answer]", None, None, False, spec, thought + JSON_ANSWER


def _core(
    tmp_path, base: str, *, model: str, jump: bool, drafts: int = 0, script=None, **own
) -> EngineCore:
    """An engine on ``base``; the scripted model writes ``out`` when ``tag`` is in the
    prompt, for each ``(tag, out)`` of ``script`` (this file's `_cases` by default)."""
    markers = _markers(base)
    tok = load_tokenizer(base).with_special_tokens(markers)
    if model == "scripted":
        if script is None:
            script = [(tag, out) for tag, *_, out in _cases(base)]
        rules = [{"match": tag, "output": out} for tag, out in script]
        path = tmp_path / f"script-{base}.json"
        path.write_text(json.dumps({"rules": rules, "default": ""}))
        own = {"script": str(path)}
    config = EngineConfig(
        model=model,
        tokenizer=base,
        extra_special_tokens=tuple(markers),
        runner_options=own,
        reasoning_parser="qwen3" if base == "qwen3" else None,
        max_num_seqs=64,
        jump_forward=jump,
        draft_tokens=drafts,
        structured_output=StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
        seed=3,
    )
    return EngineCore(config, tok)


def _drain(core: EngineCore, timeout_s: float = 600.0) -> dict[str, list]:
    """Every request's outputs, in order."""
    got: dict[str, list] = {}
    deadline = time.monotonic() + timeout_s
    while core.has_work:
        assert time.monotonic() < deadline, "the engine did not drain"
        if not core.has_runnable:  # a grammar is compiling
            time.sleep(0.01)
        for _, o in core.step():
            got.setdefault(o.request_id, []).append(o)
    return got


def _prompt(tok, tag: str, thinking: bool) -> list[int]:
    text = f"<|im_start|>user\n{tag} Weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    return tok.encode(text if thinking else f"{tag} Weather in Paris?")


def _answer(tok, ids: list[int], thinking: bool) -> tuple[str, list[int]]:
    """The answer's text (after the thought and its separator) and where the engine's
    outputs cut it, in characters."""
    text = tok.decode(ids)
    start = 0
    if thinking:
        end = text.index("</think>") + len("</think>")
        start = end + len(text[end:]) - len(text[end:].lstrip("\n"))
    return text[start:], start


def _stream_cuts(tok, outputs, start: int) -> list[int]:
    cuts, ids = [], []
    for o in outputs:
        ids += o.new_token_ids
        cuts.append(len(tok.decode(ids)) - start)
    return [c for c in cuts if c > 0]


def _format(fam: str | None, tok) -> ToolFormat:
    return create_tool_format(fam, tok) if fam else JsonSchemaToolFormat(tok)


def _run_cases(core: EngineCore, cases, thinking: bool, **sampling) -> dict[str, list]:
    tok = core.tokenizer
    for tag, _, _, _, spec, _ in cases:
        req = EngineCoreRequest(
            tag,
            _prompt(tok, tag, thinking),
            SamplingParams(max_tokens=160, **sampling),
            StructuredOutputSpec(spec.kind.value, spec.value),
            reasoning_ended=False if thinking else None,
        )
        assert core.add_request(b"t", req) == []
    return _drain(core)


def _check_output(tok, case, outputs, thinking: bool):
    """The output's ids and its parsed answer, after checking both are right."""
    tag, fam, named, parallel, _, _ = case
    finals = [o for o in outputs if o.finished]
    assert len(finals) == 1 and finals[0].finish_reason == FinishReason.STOP, (
        tag,
        finals[-1].error,
    )
    ids = [t for o in outputs for t in o.new_token_ids]
    text, start = _answer(tok, ids[:-1], thinking)  # without the stop token
    if fam is None:
        jsonschema.validate(json.loads(text), SCHEMA)
        return ids, _format(None, tok).parse(text, EXAMPLE_TOOLS)
    fmt = _format(fam, tok)
    whole = fmt.parse(text, EXAMPLE_TOOLS, named=named)
    streamed = stream_parse(
        fmt, text, EXAMPLE_TOOLS, _stream_cuts(tok, outputs, start), named=named
    )
    assert call_errors(whole, EXAMPLE_TOOLS, named, parallel) == [], (tag, text)
    assert same_output(whole, streamed, compare_ids=fam == "kimi_k2"), (tag, text)
    return ids, whole


@pytest.mark.parametrize("base", VOCABS)
def test_greedy_outputs_are_the_same_with_and_without_jump_forward(base, tmp_path):
    cases = list(_cases(base))
    thinking = base == "qwen3"
    results = {}
    for jump in (False, True):
        core = _core(tmp_path, base, model="scripted", jump=jump)
        try:
            got = _run_cases(core, cases, thinking, temperature=0.0)
            results[jump] = {}
            for case in cases:
                outputs = got[case[0]]
                ids, parsed = _check_output(core.tokenizer, case, outputs, thinking)
                results[jump][case[0]] = (ids, parsed, outputs)
            if jump:
                assert core.num_jumped_tokens > 0
        finally:
            core.close()
    for tag, (ids, parsed, outputs) in results[True].items():
        ids_off, parsed_off, outputs_off = results[False][tag]
        assert ids == ids_off, tag
        assert same_output(parsed, parsed_off, compare_ids=False), tag
        # with jump forward a step may carry several tokens: never more steps
        assert len(outputs) <= len(outputs_off), tag
    named = [t for t in results[True] if "-get_weather-" in t]
    fewer = [t for t in named if len(results[True][t][2]) < len(results[False][t][2])]
    print({t: (len(results[True][t][2]), len(results[False][t][2])) for t in results[True]})
    assert len(fewer) >= len(named) // 2, "jump forward saved steps on too few named calls"


# ----- the engine, random --------------------------------------------------------------


def _ending_texts(base: str, tok) -> list[str]:
    ends: set[str] = set()
    for fam in BASES[base]:
        fmt = create_tool_format(fam, tok)
        for tools in tool_sets(1, 3):
            for named in (None, tools[0].name):
                for end in free_text_ends(fmt.constraint(tools, named=named, parallel=True)):
                    close = end.find(">", end.find("</"))
                    ends.add(end[: close + 1] if "</" in end and close > 0 else end)
    return sorted(ends)


#: tool sets per family with the random model: the default run takes the first, with
#: its four grammars (required and named, parallel calls on and off) where the
#: vocabulary has one family, and two of them where it has several (one with parallel
#: calls, one without, alternating between the families, so all four ways run);
#: ``-m slow`` two, with all four grammars each
RANDOM_TOOL_SETS = 1
FULL_RANDOM_TOOL_SETS = 2


@pytest.mark.parametrize("base", VOCABS)
def test_random_outputs_with_jump_forward_are_valid_and_stream_as_whole(base, tmp_path):
    _check_random(base, tmp_path, RANDOM_TOOL_SETS, every_way=False)


@pytest.mark.slow
@pytest.mark.parametrize("base", VOCABS)
def test_random_outputs_with_jump_forward_are_valid_and_stream_as_whole_full(base, tmp_path):
    _check_random(base, tmp_path, FULL_RANDOM_TOOL_SETS, every_way=True)


def _ways(i: int, named: str, every_way: bool) -> list[tuple[str | None, bool]]:
    """(named, parallel) of the grammars of family ``i``: all four, or two that
    alternate with ``i``."""
    if every_way:
        return [(n, p) for n in (None, named) for p in (True, False)]
    return [(None, i % 2 == 0), (named, i % 2 == 1)]


def _check_random(base: str, tmp_path, tool_sets_per_family: int, every_way: bool) -> None:
    tok = load_tokenizer(base).with_special_tokens(_markers(base))
    core = _core(tmp_path, base, model="random", jump=True, ending_texts=_ending_texts(base, tok))
    cases: list[tuple[str, str, str | None, bool, list[FunctionTool], GrammarSpec]] = []
    every_way = every_way or len(BASES[base]) == 1
    for i, fam in enumerate(BASES[base]):
        fmt = create_tool_format(fam, tok)
        seed = zlib.crc32(fam.encode())
        for k, tools in enumerate(tool_sets(seed, tool_sets_per_family)):
            rng = random.Random(seed + k)
            for named, parallel in _ways(i, rng.choice(tools).name, every_way):
                spec = fmt.constraint(tools, named=named, parallel=parallel)
                cases.append((f"{fam}-{k}-{named}-{parallel}", fam, named, parallel, tools, spec))
    try:
        for i, (tag, _, _, _, _, spec) in enumerate(cases):
            req = EngineCoreRequest(
                tag,
                tok.encode("Call the right tool."),
                SamplingParams(max_tokens=384, seed=i),
                StructuredOutputSpec(spec.kind.value, spec.value),
            )
            assert core.add_request(b"t", req) == []
        got = _drain(core)
        assert core.num_jumped_tokens > 0
    finally:
        core.close()
    stopped = 0
    for tag, fam, named, parallel, tools, _ in cases:
        outputs = got[tag]
        final = outputs[-1]
        assert final.finished and final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        assert final.error is None, (tag, final.error)
        if final.finish_reason != FinishReason.STOP:
            continue
        stopped += 1
        ids = [t for o in outputs for t in o.new_token_ids]
        text = tok.decode(ids[:-1])
        fmt = create_tool_format(fam, tok)
        whole = fmt.parse(text, tools, named=named)
        cuts = _stream_cuts(tok, outputs, 0)
        streamed = stream_parse(fmt, text, tools, [c for c in cuts if c < len(text)], named)
        assert call_errors(whole, tools, named, parallel) == [], (tag, text)
        assert same_output(whole, streamed, compare_ids=fam == "kimi_k2"), (tag, text)
    assert stopped >= 0.8 * len(cases)


# ----- a jump before the first pass ----------------------------------------------------


@pytest.mark.parametrize("thinking", [False, True])
def test_a_forced_start_is_jumped_before_the_first_pass(tmp_path, thinking):
    """An answer that begins at once under its grammar has what the grammar forces
    first appended before the first forward pass, which takes it with the prompt: the
    first output holds it and the sampled token after it, and the output is the one
    written without jump forward. While the model may think first, nothing is."""
    case = next(c for c in _cases("qwen3") if c[0] == "[hermes-get_weather-False]")
    tag, spec, text = case[0], case[4], case[5] if thinking else case[5].split("\n\n", 1)[1]
    runs = {}
    for jump in (False, True):
        core = _core(tmp_path, "qwen3", model="scripted", jump=jump, script=[(tag, text)])
        try:
            req = EngineCoreRequest(
                tag,
                _prompt(core.tokenizer, tag, True),
                SamplingParams(max_tokens=160, temperature=0.0),
                StructuredOutputSpec(spec.kind.value, spec.value),
                reasoning_ended=False if thinking else True,
            )
            assert core.add_request(b"t", req) == []
            runs[jump] = _drain(core)[tag]
        finally:
            core.close()
    tok = load_tokenizer("qwen3")
    ids = [t for o in runs[True] for t in o.new_token_ids]
    assert ids == [t for o in runs[False] for t in o.new_token_ids]
    assert runs[True][-1].finish_reason == FinishReason.STOP
    first = tok.decode(runs[True][0].new_token_ids)
    if thinking:
        assert len(runs[True][0].new_token_ids) == 1
    else:
        assert first.startswith('<tool_call>\n{"name') and len(runs[True][0].new_token_ids) > 3
        assert len(runs[True]) < len(runs[False]) - 1


def test_hf_greedy_outputs_are_the_same_with_a_jump_before_a_chunked_prefill(tmp_path):
    """A Hugging Face model (float64), jump forward on, whose prompts are prefilled in
    chunks of 8 tokens over several steps while their outputs already hold a jumped
    start, beside a request that thinks first, with drafts on: greedy outputs are those
    of a prefill in one pass without drafts (a random model under a mask may split
    forced text otherwise than the jump does, so jump forward off is no reference)."""
    from tests.support.tiny_model import build_model

    path = build_model(tmp_path / "model", "qwen3", seed=2)
    tok = load_tokenizer("qwen3")
    fmt = create_tool_format("hermes", tok)
    prompts = [
        ("named", "get_weather", True),
        ("required", None, True),
        ("thinking", "get_weather", False),
    ]
    runs = {}
    for chunk, drafts in ((2048, 0), (8, 3)):
        config = EngineConfig(
            model=str(path),
            tokenizer="qwen3",
            dtype="float64",
            max_num_seqs=4,
            max_num_batched_tokens=chunk,
            jump_forward=True,
            draft_tokens=drafts,
            reasoning_parser="qwen3",
            structured_output=StructuredOutputConfig(compile_workers=0, compile_timeout_s=60),
        )
        core = EngineCore(config, tok)
        try:
            for rid, named, ended in prompts:
                spec = fmt.constraint(EXAMPLE_TOOLS, named=named, parallel=False)
                text = f"<|im_start|>user\nWeather in Paris, {rid}?<|im_end|>\n"
                req = EngineCoreRequest(
                    rid,
                    tok.encode(text + "<|im_start|>assistant\n"),
                    SamplingParams(max_tokens=40, temperature=0.0),
                    StructuredOutputSpec(spec.kind.value, spec.value),
                    reasoning_ended=ended,
                )
                assert core.add_request(b"t", req) == []
            got = _drain(core)
            for rid, outs in got.items():
                assert outs[-1].error is None, (rid, outs[-1].error)
            runs[chunk] = {k: [t for o in v for t in o.new_token_ids] for k, v in got.items()}
            assert core.num_jumped_tokens > 0
            if drafts:
                assert core.num_draft_tokens > 0
        finally:
            core.close()
    assert runs[8] == runs[2048]
    assert tok.decode(runs[8]["named"][:2]) == "<tool_call>\n"
