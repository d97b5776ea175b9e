"""Forced calls through a format and back: constrain, generate with the adversarial
sampler, parse the whole output and the stream of it as the front end does (a forced
parser), and check the calls.

`round_trip` runs every tool set with tool_choice "required" and named, and
``parallel_tool_calls`` on and off (one generation of each grammar, or several), and
returns the figures; `forced_parse_errors`
says what is wrong with the reading of one output, `call_errors` with one parsed
output, if anything. `front_end_read` reads an engine's output as the front end does
(reasoning split, then the forced tool parser), whole or in pieces; `Tally` counts a
family's round trip through the engine and prints or records it.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import jsonschema

from engine_core.client import RequestOutput
from frontend.response import OutputProcessor
from frontend.tool_formats import FunctionTool, ParsedOutput, ToolCallParser, ToolFormat, collect
from ipc import EngineCoreOutput
from reasoning import ReasoningTracker

from .constrained_sampler import ConstrainedSampler, free_text_ends


def call_errors(
    parsed: ParsedOutput, tools: Sequence[FunctionTool], named: str | None, parallel: bool
) -> list[str]:
    """Why ``parsed`` is not a valid forced call: no call, too many, a name not
    offered (or not the named one), arguments that are not JSON or not valid for the
    tool's schema, or content beside the calls."""
    errors = []
    by_name = {t.name: t for t in tools}
    calls = parsed.tool_calls
    if not calls:
        errors.append("no call")
    if (named is not None or not parallel) and len(calls) > 1:
        errors.append(f"{len(calls)} calls where one is allowed")
    if parsed.content is not None:
        errors.append(f"content beside the calls: {parsed.content!r}")
    for c in calls:
        tool = by_name.get(c.name)
        if tool is None or (named is not None and c.name != named):
            errors.append(f"call of {c.name!r}")
            continue
        try:
            args = json.loads(c.arguments)
        except ValueError as e:
            errors.append(f"{c.name}: arguments are not JSON ({e}): {c.arguments!r}")
            continue
        validator = jsonschema.validators.validator_for(tool.schema)(tool.schema)
        problems = [e.message for e in validator.iter_errors(args)]
        if problems:
            errors.append(f"{c.name}: {problems[0]} in {c.arguments!r}")
    return errors


def stream_parse(
    fmt: ToolFormat,
    text: str,
    tools: Sequence[FunctionTool],
    cuts: Iterable[int],
    named: str | None = None,
    *,
    forced: bool = False,
) -> ParsedOutput:
    """``text`` pushed in pieces ending at ``cuts``, folded like a client would."""
    parser = fmt.new_parser(tools, named=named, forced=forced)
    deltas = []
    pos = 0
    for cut in sorted(set(cuts)):
        if 0 < cut < len(text):
            deltas.append(parser.push(text[pos:cut]))
            pos = cut
    deltas.append(parser.push(text[pos:]))
    deltas.append(parser.finish())
    check_delta_form(deltas)
    return collect(deltas)


def check_delta_form(deltas: Sequence) -> None:
    """The OpenAI stream form: a call's first piece has its id and name, later pieces
    have neither; calls appear in index order."""
    seen: set[int] = set()
    last = -1
    for d in deltas:
        for c in d.tool_calls:
            if c.index not in seen:
                assert c.index == last + 1, f"call {c.index} began after call {last}"
                assert c.id and c.name, f"first piece of call {c.index} lacks id or name"
                seen.add(c.index)
                last = c.index
            else:
                assert c.id is None and c.name is None, f"call {c.index} renamed"


def same_output(a: ParsedOutput, b: ParsedOutput, *, compare_ids: bool) -> bool:
    def key(p: ParsedOutput) -> tuple:
        return (
            p.content,
            [(c.name, c.arguments, c.id if compare_ids else None) for c in p.tool_calls],
        )

    return key(a) == key(b)


def forced_parse_errors(
    fmt: ToolFormat,
    text: str,
    tools: Sequence[FunctionTool],
    named: str | None,
    parallel: bool,
    rng: random.Random,
) -> tuple[ParsedOutput, list[str]]:
    """The front end's reading of ``text``, an output of ``fmt``'s constraint (its
    forced parse), and what is wrong with it: no valid forced call (`call_errors`), a
    stream (forced, cut at random) that differs from it, or an auto parse that reads
    other calls."""
    compare_ids = fmt.name == "kimi_k2"
    whole = fmt.parse(text, tools, named=named, forced=True)
    streamed = stream_parse(fmt, text, tools, random_cuts(rng, len(text)), named, forced=True)
    errors = call_errors(whole, tools, named, parallel)
    if not same_output(whole, streamed, compare_ids=compare_ids):
        errors.append(f"stream {streamed!r} != whole {whole!r}")
    auto = fmt.parse(text, tools, named=named)
    if not same_output(whole, auto, compare_ids=compare_ids):
        errors.append(f"forced {whole!r} != auto {auto!r}")
    return whole, errors


def random_cuts(rng: random.Random, length: int) -> list[int]:
    """Cut points: one-character pieces, a few pieces, or anything between."""
    style = rng.random()
    if style < 0.2:
        return list(range(1, length))
    count = rng.randint(0, max(1, length // rng.choice((2, 5, 20))))
    return sorted(rng.randrange(1, length) for _ in range(count)) if length > 1 else []


@dataclass
class RoundTrip:
    family: str
    generations: int = 0
    finished: int = 0
    valid: int = 0
    multi_call: int = 0
    tokens: int = 0
    compile_s: float = 0.0
    generate_s: float = 0.0
    parse_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    #: a few outputs cut by max_tokens, to show why they did not end
    unfinished: list[str] = field(default_factory=list)

    @property
    def finished_pct(self) -> float:
        return 100.0 * self.finished / max(self.generations, 1)

    @property
    def valid_pct(self) -> float:
        return 100.0 * self.valid / max(self.finished, 1)

    def row(self) -> str:
        mean_tokens = self.tokens / max(self.generations, 1)
        return (
            f"{self.family:<16} {self.generations:>5} {self.finished_pct:>8.1f}% "
            f"{self.valid_pct:>8.1f}% {self.multi_call:>6} {mean_tokens:>8.1f}"
            f" {self.compile_s:>8.1f}s {self.generate_s:>8.1f}s {self.parse_s:>6.2f}s"
        )

    HEADER = (
        f"{'family':<16} {'gens':>5} {'finished':>9} {'valid':>9} {'multi':>6} {'tokens':>8}"
        f" {'compile':>9} {'generate':>9} {'parse':>7}"
    )


def round_trip(
    family: str,
    fmt: ToolFormat,
    sampler: ConstrainedSampler,
    tool_sets: Iterable[list[FunctionTool]],
    *,
    seed: int,
    max_tokens: int = 512,
    samples: int = 1,
) -> RoundTrip:
    """Every tool set x (required, named) x (parallel, not): constrain, generate
    ``samples`` times (a compile costs far more than a generation), parse whole and
    streamed, check. Failures carry the seed and case to reproduce."""
    stats = RoundTrip(family)
    tokenizer = sampler.tokenizer
    for k, tools in enumerate(tool_sets):
        rng = random.Random(seed * 1_000_003 + k)
        for named in (None, rng.choice(tools).name):
            for parallel in (True, False):
                spec = fmt.constraint(tools, named=named, parallel=parallel)
                t0 = time.perf_counter()
                compiled = sampler.compile(spec)
                stats.compile_s += time.perf_counter() - t0
                for sample in range(samples):
                    case = f"seed={seed} set={k} named={named} parallel={parallel}"
                    if samples > 1:
                        case += f" sample={sample}"
                    t1 = time.perf_counter()
                    try:
                        gen = sampler.generate(
                            compiled,
                            rng,
                            max_tokens=max_tokens,
                            free_text_ends=free_text_ends(spec),
                        )
                    except AssertionError as e:
                        raise AssertionError(f"{case}: {e}") from e
                    stats.generate_s += time.perf_counter() - t1
                    stats.generations += 1
                    stats.tokens += len(gen.token_ids)
                    if not gen.finished:
                        continue
                    stats.finished += 1
                    ids = gen.token_ids
                    if gen.stop_id is not None and rng.random() < 0.5:
                        ids = [*ids, gen.stop_id]  # the content may end with the stop text
                    text = tokenizer.decode(ids)
                    t3 = time.perf_counter()
                    whole, errors = forced_parse_errors(fmt, text, tools, named, parallel, rng)
                    stats.parse_s += time.perf_counter() - t3
                    if errors:
                        stats.failures.append(f"{case}: {errors[0]}\n  output: {text!r}")
                    else:
                        stats.valid += 1
                        stats.multi_call += len(whole.tool_calls) > 1
    return stats


def front_end_read(
    tokenizer,
    ids: Sequence[int],
    final: EngineCoreOutput,
    tracker: ReasoningTracker,
    tool_parser: ToolCallParser,
    sizes: Sequence[int] = (),
) -> tuple[str, ParsedOutput]:
    """The reasoning and the message the front end makes of an engine's output ``ids``
    (its stop token last, if it stopped on one) that ended with ``final``, fed in
    outputs of ``sizes`` tokens (the rest in one; none: all at once): the request's
    reasoning tracker splits it, the tool parser reads the content, in the front end's
    own `OutputProcessor`. Every call is kept (a grammar that let a second call through
    where one is allowed must show)."""
    proc = OutputProcessor(
        token_bytes=tokenizer.token_bytes,
        prompt_tokens=0,
        tracker=tracker,
        tool_parser=tool_parser,
    )
    bounds = [0]
    for s in sizes:
        if bounds[-1] + s < len(ids):
            bounds.append(bounds[-1] + s)
    bounds.append(len(ids))
    deltas = []
    for k in range(len(bounds) - 1):
        last = k == len(bounds) - 2
        out = RequestOutput(
            final.request_id,
            list(ids[bounds[k] : bounds[k + 1]]),
            final.finish_reason if last else None,
            final.stop_reason if last else None,
        )
        deltas.append(proc.push(out))
    check_delta_form(deltas)
    return "".join(d.reasoning for d in deltas), collect(deltas)


def random_sizes(rng: random.Random, length: int) -> list[int]:
    """Output sizes in tokens: one token each, a few outputs, or anything between."""
    cuts = random_cuts(rng, length)
    return [b - a for a, b in zip([0, *cuts], [*cuts, length], strict=True) if b > a]


#: where `Tally.record` appends its JSON line, when set
ROUNDTRIP_OUT = "THINKGATE_ROUNDTRIP_OUT"


@dataclass
class Tally:
    """One family's round trip through the engine, thinking on or off: requests sent,
    finished with stop, valid among those, stream equal to whole among those, internal
    errors (requests the engine failed), and with thinking on, outputs that thought
    and ended their thinking."""

    family: str
    reasoning: str
    thinking: bool
    requests: int = 0
    finished: int = 0
    valid: int = 0
    stream_equal: int = 0
    errors: int = 0
    thought: int = 0
    failures: list[str] = field(default_factory=list)
    #: the ends of a few outputs max_tokens cut, to show why they did not end
    unfinished: list[str] = field(default_factory=list)

    HEADER = (
        f"{'family':<13} {'reasoning':<14} {'thinking':<8} {'requests':>8} {'finished':>8}"
        f" {'valid':>6} {'stream=whole':>12} {'errors':>6} {'thought':>7}"
    )

    def row(self) -> str:
        return (
            f"{self.family:<13} {self.reasoning:<14} {'on' if self.thinking else 'off':<8}"
            f" {self.requests:>8} {self.finished:>8} {self.valid:>6} {self.stream_equal:>12}"
            f" {self.errors:>6} {self.thought:>7}"
        )

    def record(self) -> None:
        """Append the counts as one JSON line to the file `ROUNDTRIP_OUT` names."""
        path = os.environ.get(ROUNDTRIP_OUT)
        if path:
            counts = {k: v for k, v in asdict(self).items() if k not in ("failures", "unfinished")}
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(counts) + "\n")
