"""A corpus of near-miss outputs per family, generated rather than listed.

The starting points are valid outputs: random tool sets (`tests.support.toolsets`),
each family's own "required" constraint with parallel calls, and the adversarial
sampler. Each is then edited the ways real models go wrong, reading the family's
markup off its description (`ToolFormat.markup`):

- ``space``: whitespace before or after one occurrence of a markup text;
- ``drop``: one occurrence of a markup text left out (a missing closer or opener);
- ``line``: one separator between calls written as a line break (calls one per line);
- ``rename``: one tool name changed to another tool's, a misspelling, or a name that
  is no tool at all;
- ``prose``: a sentence of prose before or after everything;
- ``repeat``: the output written twice, on two lines;
- truncation: cut at any position (the last edit, when drawn).

Prose sentences hold unique words (`SENTINEL`) that no output of a constraint holds,
so that a test can count where each one went.
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from frontend.tool_formats import FunctionTool, ToolFormat
from frontend.tool_formats.json_schema import JsonSchemaToolFormat
from tests.support.constrained_sampler import free_text_ends
from tests.support.toolsets import tool_sets

from .conftest import format_for, sampler_for

#: tool sets per family, and generations per tool set
TOOL_SETS = 3
PER_SET = 3
MAX_TOKENS = 384
#: the name under which the JSON-schema way (not a registered family) is tested
JSON_WAY = "json_schema"
EDITS = ("space", "drop", "line", "rename", "prose", "repeat")
SPACES = (" ", "\n", "  ", "\n\n", "\t", " \n")
SENTINEL = re.compile(r"Zq\d+x")


@dataclass(frozen=True)
class Sample:
    tools: tuple[FunctionTool, ...]
    text: str


def format_of(family: str) -> ToolFormat:
    if family == JSON_WAY:
        return JsonSchemaToolFormat(format_for("hermes").tokenizer)
    return format_for(family)


@functools.cache
def valid_outputs(family: str) -> tuple[Sample, ...]:
    """Finished outputs of the family's "required" constraint (parallel calls on)."""
    fmt = format_of(family)
    sampler = sampler_for(fmt.tokenizer)
    seed = zlib.crc32(f"near-miss {family}".encode())
    rng = random.Random(seed)
    out = []
    for tools in tool_sets(seed, TOOL_SETS, max_tools=4):
        spec = fmt.constraint(tools, named=None, parallel=True)
        compiled = sampler.compile(spec)
        for _ in range(PER_SET):
            gen = sampler.generate(
                compiled, rng, max_tokens=MAX_TOKENS, free_text_ends=free_text_ends(spec)
            )
            if gen.finished:
                out.append(Sample(tuple(tools), fmt.tokenizer.decode(gen.token_ids)))
    assert out, f"{family}: no finished output to start from"
    return tuple(out)


def occurrences(text: str, needles: Sequence[str]) -> list[tuple[int, int]]:
    """Every (start, end) of every needle in ``text``."""
    spans = []
    for needle in needles:
        start = text.find(needle)
        while start >= 0:
            spans.append((start, start + len(needle)))
            start = text.find(needle, start + 1)
    return sorted(spans)


def name_spans(text: str, names: Sequence[str]) -> list[tuple[int, int]]:
    """Where a tool name stands as a word (not inside a longer name)."""
    spans = []
    for name in names:
        for m in re.finditer(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text):
            spans.append(m.span())
    return sorted(spans)


def edit(fmt: ToolFormat, sample: Sample, kind: str, text: str, rng: random.Random) -> str:
    """One edit of ``kind`` to ``text`` (an edit with nowhere to apply leaves it)."""
    markup = fmt.markup
    names = [t.name for t in sample.tools]
    if kind in ("space", "drop"):
        spans = occurrences(text, markup.texts)
        if not spans:
            return text
        start, end = rng.choice(spans)
        if kind == "drop":
            return text[:start] + text[end:]
        space = rng.choice(SPACES)
        where = rng.choice(("before", "after", "both"))
        before = space if where != "after" else ""
        after = space if where != "before" else ""
        return text[:start] + before + text[start:end] + after + text[end:]
    if kind == "line":
        spans = occurrences(text, [markup.separator] if markup.separator else [])
        if not spans:
            return text
        start, end = rng.choice(spans)
        return text[:start] + markup.separator.strip() + "\n" + text[end:]
    if kind == "rename":
        spans = name_spans(text, names)
        if not spans:
            return text
        start, end = rng.choice(spans)
        old = text[start:end]
        new = rng.choice([*(n for n in names if n != old), old[:-1], "no_such_tool"])
        return text[:start] + new + text[end:]
    if kind == "prose":
        sentence = f"Let me check Zq{rng.randrange(10**6)}x first"
        return sentence + "\n" + text if rng.random() < 0.5 else text + "\n" + sentence
    if kind == "repeat":
        return text + "\n" + text
    raise ValueError(kind)
