"""How much of a decode's mask fill is spent inside JSON strings whose mask repeats.

Each of the bench's four grammars (`states.py`) writes ``--docs`` random documents,
token by token, with the engine's matchers (`GuardedMatcher`), its mask filled before
each token (xgrammar's fill, timed). At each step inside a JSON string (the guard's
lexer: in a string, no escape or character pending), the matcher's parser state is
read (xgrammar's scanable states, each rule's start as a distance back from the
current position; timed too) and compared with the one at the string's previous step;
a token with a quote in it starts a new string. Where the two agree, the step is a
*repeat*, and its mask is checked against the mask at that previous step.

What it answers: the share of fill time a per-row cache of in-string masks could skip
(the repeats' fills), what reading the states costs, and whether equal states gave
equal masks on every repeat. The states do not show everything: a counted repetition
(a ``minLength`` string) keeps its count in a rule that is not scanable while an item
inside it is read, so two steps can print alike and differ; these four grammars have
none. It times xgrammar's fill and the reading of states only: no cache is run here.
"""

from __future__ import annotations

import argparse
import random
import re
import time

import torch
import xgrammar as xgr

from structured_output.bitmask import bitmask_words
from structured_output.guard import GuardedMatcher
from structured_output.lexing import STR
from structured_output.utf8 import DONE

from . import states
from .common import Record, environment

_HEAD = re.compile(r"There are (\d+) steps in history\. Last step: \[")
_START = re.compile(r"rule_start_pos=(-?\d+), ")


def state_key(matcher: xgr.GrammarMatcher) -> str:
    """The matcher's scanable parser states, each rule's start as a distance back."""
    text = matcher._debug_print_internal_state()
    head = _HEAD.match(text)
    if head is None:
        raise AssertionError(f"xgrammar's state print has changed: {text[:80]!r}")
    here = int(head.group(1)) - 1
    return _START.sub(lambda m: f"back={here - int(m.group(1))}, ", text[head.end() :])


def run(args: argparse.Namespace) -> list[Record]:
    env = environment()
    v = states.vocab("qwen3")
    grams = states.compiled("qwen3")
    table = states.guard("qwen3")
    stops = list(v.tokenizer.stop_token_ids)
    quote = [b'"' in b for b in v.token_bytes]
    mask = torch.zeros((1, bitmask_words(v.vocab_rows)), dtype=torch.int32)
    fill = xgr.GrammarMatcher.fill_next_token_bitmask
    rng = random.Random(args.seed)
    records = []
    for name in states.GRAMMARS:
        steps = in_string = repeats = equal = 0
        total = repeat_time = key_time = 0.0
        for _ in range(args.docs):
            ids = v.encode(states.document(rng, name, v.markers))
            m = GuardedMatcher(
                grams[name], table, json_text=grams[name].json_text, override_stop_tokens=stops
            )
            last: tuple[str, torch.Tensor] | None = None  # this string's previous step
            for t in ids:
                t0 = time.perf_counter()
                fill(m, mask, 0)
                took = time.perf_counter() - t0
                steps += 1
                total += took
                lex, _, pending = table.decode(m.guard_state)
                if lex == STR and pending == DONE:
                    in_string += 1
                    t0 = time.perf_counter()
                    key = state_key(m)
                    key_time += time.perf_counter() - t0
                    if last is not None and last[0] == key:
                        repeats += 1
                        repeat_time += took
                        equal += bool(torch.equal(last[1], mask[0]))
                    last = (key, mask[0].clone())
                if not m.accept_token(t):
                    raise AssertionError(f"{name} rejected token {t} of its own document")
                if quote[t]:
                    last = None
        records.append(
            Record(
                bench="strings",
                device="cpu",
                vocab="qwen3",
                vocab_rows=v.vocab_rows,
                batch_size=1,
                method=name,
                median_us=round(total / steps * 1e6, 1),
                p90_us=0.0,
                per_row_median_us=round(total / steps * 1e6, 1),
                per_row_p90_us=0.0,
                iters=steps,
                warmup=0,
                seed=args.seed,
                grammars=[name],
                extra={
                    "docs": args.docs,
                    "steps": steps,
                    "in_string_steps": in_string,
                    "repeats": repeats,
                    "repeats_with_equal_masks": equal,
                    "fill_ms": round(total * 1e3, 2),
                    "repeat_fill_ms": round(repeat_time * 1e3, 2),
                    "state_reading_ms": round(key_time * 1e3, 2),
                },
                env=env,
            )
        )
    return records


def table(records: list[Record]) -> str:
    head = (
        f"{'grammar':<18}{'steps':>7}{'in strings':>12}{'repeats':>9}{'of steps':>10}"
        f"{'of fill time':>14}{'reading states':>16}{'equal masks':>13}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        x = r.extra
        lines.append(
            f"{r.method:<18}{x['steps']:>7}{x['in_string_steps']:>12}{x['repeats']:>9}"
            f"{x['repeats'] / x['steps']:>10.0%}{x['repeat_fill_ms'] / x['fill_ms']:>14.0%}"
            f"{x['state_reading_ms'] / x['fill_ms']:>16.0%}"
            f"{x['repeats_with_equal_masks']:>8}/{x['repeats']}"
        )
    return "\n".join(lines)
