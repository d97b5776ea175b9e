"""Forced calls stream as they are written, for every registered family and the
JSON-schema way.

Outputs come from each format's own constraint (tool_choice "required" with parallel
calls, and a named tool) through the adversarial sampler, on tools of several
parameters (a string, an integer, a non-ASCII enum, an array). For each output:

- the forced parse (``forced=True``) reads the same calls and content as the auto
  parse, and a finished output's calls are valid;
- stream equals whole, ids and indices included, cut at every character and at random;
- the stream is incremental: a call's first piece (index, id, name) comes before its
  arguments are complete, and some arguments text comes before the call is complete;
- what streams from any prefix of the output holds for the whole (never taken back);
- through the `OutputProcessor`, with thinking before the call: reasoning, content,
  calls and finish reason are the same whole, one token per output, in random groups
  of tokens, and with tokens split into single bytes (cutting inside multi-byte
  UTF-8); the chunks of a stream fold into its message exactly, ids included.
"""

from __future__ import annotations

import functools
import random

import pytest

from engine_core.client import RequestOutput
from frontend.chunks import ChunkMaker, CompletionAccumulator, fold_chunks
from frontend.response import OutputProcessor
from frontend.tool_formats import FunctionTool, ParsedOutput, ToolFormat, collect
from ipc import FinishReason
from reasoning import create_reasoning_parser
from tests.support.constrained_sampler import free_text_ends
from tests.support.roundtrip import call_errors, random_cuts, same_output, stream_parse
from tokenization import Tokenizer

from .conftest import FAMILIES, format_for, json_schema_format, sampler_for

FORECAST = FunctionTool(
    "get_forecast",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"enum": ["°C", "°F", "東京"]},
        },
        "required": ["city", "days", "unit"],
        "additionalProperties": False,
    },
)
NOTE = FunctionTool(
    "add_note",
    {
        "type": "object",
        "properties": {
            "text": {"type": "string", "maxLength": 30},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        },
        "required": ["text", "tags"],
        "additionalProperties": False,
    },
)
TOOLS = [FORECAST, NOTE]
#: the ways a call is forced: (named, parallel)
CHOICES = [(None, True), ("get_forecast", False)]
CASES = [(f, named, parallel) for f in [*FAMILIES, "json_schema"] for named, parallel in CHOICES]
GENERATIONS = 4
THOUGHT = "<think>\nForecast for 東京, é: a tool.\n</think>\n\n"


def format_named(family: str) -> ToolFormat:
    return json_schema_format("qwen3") if family == "json_schema" else format_for(family)


@functools.cache
def outputs(family: str, named: str | None, parallel: bool) -> list[tuple[list[int], bool, int]]:
    """Generations of the format's constraint: (token ids, finished, seed)."""
    fmt = format_named(family)
    sampler = sampler_for(fmt.tokenizer)
    spec = fmt.constraint(TOOLS, named=named, parallel=parallel)
    grammar = sampler.compile(spec)
    found = []
    for seed in range(GENERATIONS):
        rng = random.Random(seed)
        gen = sampler.generate(grammar, rng, max_tokens=300, free_text_ends=free_text_ends(spec))
        found.append((gen.token_ids, gen.finished, seed))
    return found


def calls_of(p: ParsedOutput, ids: bool) -> list[tuple]:
    return [(c.name, c.arguments, c.id if ids else None) for c in p.tool_calls]


@pytest.mark.parametrize(("family", "named", "parallel"), CASES)
def test_forced_stream_equals_whole(family: str, named: str | None, parallel: bool) -> None:
    fmt = format_named(family)
    compare_ids = family == "kimi_k2"
    for ids, finished, seed in outputs(family, named, parallel):
        text = fmt.tokenizer.decode(ids)
        case = f"seed={seed} text={text!r}"
        forced = fmt.parse(text, TOOLS, named=named, forced=True)
        auto = fmt.parse(text, TOOLS, named=named)
        if finished:
            assert not call_errors(forced, TOOLS, named, parallel), case
            assert calls_of(forced, compare_ids) == calls_of(auto, compare_ids), case
            assert forced.content == auto.content, case
        rng = random.Random(seed)
        for cuts in (range(1, len(text)), random_cuts(rng, len(text)), []):
            streamed = stream_parse(fmt, text, TOOLS, cuts, named, forced=True)
            assert same_output(streamed, forced, compare_ids=compare_ids), (case, cuts)


@pytest.mark.parametrize(("family", "named", "parallel"), CASES)
def test_forced_arguments_arrive_before_the_call_is_complete(
    family: str, named: str | None, parallel: bool
) -> None:
    """One character at a time: each call's first piece carries its name before its
    arguments are complete, and its arguments so far are, at some push, neither empty
    nor complete."""
    fmt = format_named(family)
    for ids, finished, seed in outputs(family, named, parallel):
        if not finished:
            continue
        text = fmt.tokenizer.decode(ids)
        whole = fmt.parse(text, TOOLS, named=named, forced=True)
        final = [c.arguments for c in whole.tool_calls]
        parser = fmt.new_parser(TOOLS, named=named, forced=True)
        so_far: dict[int, str] = {}
        named_early: set[int] = set()
        partial: set[int] = set()
        for ch in [*text, None]:
            d = parser.push(ch) if ch is not None else parser.finish()
            for c in d.tool_calls:
                if c.name is not None and not c.arguments:
                    named_early.add(c.index)
                so_far[c.index] = so_far.get(c.index, "") + c.arguments
            for i, args in so_far.items():
                if args and args != final[i]:
                    partial.add(i)
        every = set(range(len(final)))
        assert so_far == dict(enumerate(final)), f"seed={seed} text={text!r}"
        assert partial == every, f"seed={seed}: calls {every - partial} came whole: {text!r}"
        if family != "json_schema":  # its named call opens with its first "{"
            assert named_early == every, f"seed={seed}: a name came with arguments: {text!r}"


@pytest.mark.parametrize(("family", "named", "parallel"), CASES)
def test_what_streams_is_never_contradicted(family: str, named: str | None, parallel: bool) -> None:
    """Whatever streams from a prefix of a forced output (before its end is known)
    holds for the whole output: the same calls in order, each one's arguments a prefix
    of its final arguments. So a piece never needs taking back."""
    fmt = format_named(family)
    for ids, finished, seed in outputs(family, named, parallel):
        if not finished:
            continue
        text = fmt.tokenizer.decode(ids)
        full = fmt.parse(text, TOOLS, named=named, forced=True).tool_calls
        rng = random.Random(seed)
        for cut in rng.sample(range(1, len(text)), min(30, len(text) - 1)):
            parser = fmt.new_parser(TOOLS, named=named, forced=True)
            calls = collect([parser.push(text[:cut])]).tool_calls
            case = f"seed={seed} cut={cut} text={text!r}"
            assert len(calls) <= len(full), case
            for got, want in zip(calls, full, strict=False):
                assert got.name == want.name, case
                assert want.arguments.startswith(got.arguments), case


# ----- through the output processor ---------------------------------------------------


@functools.cache
def reasoning_tokenizer(family: str) -> Tokenizer:
    """The family's tokenizer with the markers of qwen3's reasoning parser (ids it has
    keep their values)."""
    markers = ["<think>", "</think>", "<tool_call>"]
    return format_named(family).tokenizer.with_special_tokens(markers)


@functools.cache
def byte_ids(tok: Tokenizer) -> dict[int, int]:
    """Each byte's own single-byte token."""
    table: dict[int, int] = {}
    for i, b in enumerate(tok.all_token_bytes):
        if len(b) == 1 and i not in tok.special_ids:
            table.setdefault(b[0], i)
    assert len(table) == 256, tok
    return table


def bytewise(tok: Tokenizer, ids: list[int], rng: random.Random) -> list[int]:
    """``ids`` with some ordinary tokens replaced by their bytes, one token each."""
    table = byte_ids(tok)
    out: list[int] = []
    for i in ids:
        if i in tok.special_ids or rng.random() < 0.3:
            out.append(i)
        else:
            out.extend(table[b] for b in tok.token_bytes(i))
    return out


def run(
    family: str, named: str | None, ids: list[int], groups: list[int], finish: FinishReason
) -> tuple[tuple, list, ChunkMaker]:
    """Feed ``ids`` in outputs ending at ``groups``; return what the message says
    (reasoning, content, calls as (index, id, name, arguments), finish reason) and the
    stream's chunks."""
    tok = reasoning_tokenizer(family)
    fmt = format_named(family)
    prompt = tok.encode("<|im_start|>user\nForecast?<|im_end|>\n<|im_start|>assistant\n")
    reasoning = create_reasoning_parser("qwen3", tok, {})
    proc = OutputProcessor(
        token_bytes=tok.token_bytes,
        prompt_tokens=len(prompt),
        tracker=reasoning.tracker(prompt, reasoning.reasoning_ended(prompt)),
        tool_parser=fmt.new_parser(TOOLS, named=named, forced=True),
    )
    stop = tok.eos_token_id if finish == FinishReason.STOP else None
    if stop is not None:
        ids = [*ids, stop]
    chunks = ChunkMaker("r", 0, "m")
    acc = CompletionAccumulator()
    out = [chunks.role()]
    bounds = [0, *sorted(set(g for g in groups if 0 < g < len(ids))), len(ids)]
    for k in range(len(bounds) - 1):
        last = k == len(bounds) - 2
        d = proc.push(
            RequestOutput("r", ids[bounds[k] : bounds[k + 1]], finish if last else None, stop)
        )
        acc.add(d)
        out.append(chunks.delta(d, proc.finish_reason if last else None))
    msg = acc.message()
    folded, reason, _ = fold_chunks(out)
    assert folded == msg and reason == proc.finish_reason
    calls = [(i, c.id, c.function.name, c.function.arguments) for i, c in enumerate(msg.tool_calls)]
    return (msg.reasoning, msg.content, calls, proc.finish_reason), out, chunks


def without_ids(result: tuple, keep: bool) -> tuple:
    reasoning, content, calls, reason = result
    return reasoning, content, [(i, cid if keep else None, n, a) for i, cid, n, a in calls], reason


@pytest.mark.parametrize(("family", "named", "parallel"), CASES)
def test_processor_stream_equals_whole_at_every_split(
    family: str, named: str | None, parallel: bool
) -> None:
    tok = reasoning_tokenizer(family)
    thought = tok.encode(THOUGHT)
    keep_ids = family == "kimi_k2"
    for content_ids, finished, seed in outputs(family, named, parallel):
        rng = random.Random(seed)
        finish = FinishReason.STOP if finished else FinishReason.LENGTH
        ids = thought + content_ids
        case = f"seed={seed} output={tok.decode(ids)!r}"
        whole, _, _ = run(family, named, ids, [], finish)
        assert whole[0] == "Forecast for 東京, é: a tool.", case
        if finished:
            assert whole[1] is None and whole[2] and whole[3] == "tool_calls", case
        expected = without_ids(whole, keep_ids)
        every, chunks, _ = run(family, named, ids, list(range(1, len(ids))), finish)
        assert without_ids(every, keep_ids) == expected, case
        grouped, _, _ = run(family, named, ids, random_cuts(rng, len(ids)), finish)
        assert without_ids(grouped, keep_ids) == expected, case
        split = thought + bytewise(tok, content_ids, rng)
        for groups in (list(range(1, len(split))), random_cuts(rng, len(split))):
            by_bytes, _, _ = run(family, named, split, groups, finish)
            assert without_ids(by_bytes, keep_ids) == expected, (case, groups)
        if finished:
            # one token per output: the first call's arguments come in several chunks
            pieces = [
                c
                for chunk in chunks[1:]
                for c in chunk.choices[0].delta.tool_calls
                if c.index == 0 and c.function.arguments
            ]
            assert len(pieces) > 1, case
