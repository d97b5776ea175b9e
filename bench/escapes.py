"""``thinkgate bench escapes``: decoding JSON strings full of escapes, a row at a time.

A backslash inside a JSON string is where xgrammar's fill is costliest: after it, and
in a ``\\u`` escape's digits, thousands of tokens are checked one by one (about a
millisecond or two per fill on a 2-core VM, where a fill elsewhere takes tens of
microseconds). Tool calls write such strings often: a program's lines (``\\n``,
``\\"``), a Windows path, text in another script written as ``\\u`` escapes by a model
trained on ASCII-only JSON.

Each document is decoded token by token, its mask filled before each token, by:

- ``engine``: the engine's filler (`BitmaskFiller`) over its own matcher, which keeps
  masks inside free strings and remembers the masks mid-escape within a string
  (`structured_output.string_masks`);
- ``no memo``: the same, remembering nothing mid-escape (what the memo saves);
- ``baseline``: what a vLLM user runs: xgrammar's default compilation of the same
  schema (any whitespace) and its plain matcher, filled into a fresh bitmask.

The three decode the same document in a new seeded order each pass; a pass's time is
the sum of its fills. The table gives the median over passes, per document and grammar.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import numpy as np

from structured_output import CompileOptions, GrammarSpec, LocalCompiler
from structured_output.bitmask import BitmaskFiller
from structured_output.config import StructuredOutputConfig
from structured_output.guide import RequestGuide
from tokenization import load_tokenizer

from .common import Record, environment, pair_records

PROGRAM = (
    "import json\n\n\ndef load(path):\n"
    '    """Read a settings file; \\"missing\\" keys get defaults."""\n'
    '    with open(path, encoding="utf-8") as f:\n'
    "        data = json.load(f)\n"
    '    data.setdefault("retries", 3)\n'
    '    data.setdefault("timeout", 2.5)\n'
    "    return data\n\n\n"
    'if __name__ == "__main__":\n'
    '    print(load("settings.json"))\n'
)
#: tool-call arguments whose strings are mostly escapes
DOCUMENTS: dict[str, dict[str, str]] = {
    "program": {"path": "tools/settings.py", "content": PROGRAM},
    "windows_paths": {
        "path": "C:\\Users\\Ana\\Documents\\Reports\\2024\\q3\\summary.txt",
        "content": "see D:\\shared\\finance\\q3.xlsx\tand\tD:\\shared\\finance\\q4.xlsx",
    },
    "escaped_cjk": {  # json.dumps writes it as \\u escapes
        "path": "東京/議事録.txt",
        "content": "会議は明日の午後三時から、第二会議室で行います。",
    },
}
#: the tool's schema (a write_file tool's arguments)
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}


def run(args: argparse.Namespace) -> list[Record]:
    import xgrammar as xgr

    env = environment()
    tok = load_tokenizer("qwen3")
    local = LocalCompiler(
        tok, CompileOptions(max_whitespace=StructuredOutputConfig().max_whitespace)
    )
    ours = {
        "json_schema": local.compile(GrammarSpec.of("json_schema", json.dumps(SCHEMA))),
        "json_object": local.compile(GrammarSpec.of("json_object", "")),
    }
    info = xgr.TokenizerInfo(  # as in `states.peer_compiled`: the plain vocabulary
        list(tok.all_token_bytes),
        xgr.VocabType.RAW,
        vocab_size=tok.vocab_rows,
        stop_token_ids=list(tok.stop_token_ids),
    )
    compiler = xgr.GrammarCompiler(info, max_threads=2)
    theirs = {
        "json_schema": compiler.compile_json_schema(json.dumps(SCHEMA)),
        "json_object": compiler.compile_builtin_json_grammar(),
    }
    filler = BitmaskFiller(1, tok.vocab_rows, guard=local.guard)
    order = random.Random(args.seed)
    records = []
    for doc_name, doc in DOCUMENTS.items():
        ids = tok.encode(json.dumps(doc), special=False)
        for kind in ours:
            methods = {
                "engine": lambda k=kind, i=ids: _engine(local, ours[k], filler, i, memo=True),
                "no_memo": lambda k=kind, i=ids: _engine(local, ours[k], filler, i, memo=False),
                "baseline": lambda k=kind, i=ids: _baseline(theirs[k], tok.vocab_rows, i),
            }
            times: dict[str, list[float]] = {n: [] for n in methods}
            names = list(methods)
            for i in range(args.warmup + args.iters):
                order.shuffle(names)
                for n in names:
                    took = methods[n]()
                    if i >= args.warmup:
                        times[n].append(took * 1e6)
            records += pair_records(
                "escapes",
                {n: np.asarray(ts) for n, ts in times.items()},
                device="cpu",
                vocab="qwen3",
                vocab_rows=tok.vocab_rows,
                batch_size=1,
                iters=args.iters,
                warmup=args.warmup,
                seed=args.seed,
                grammars=[kind],
                env=env,
                extra={"document": doc_name, "tokens": len(ids)},
            )
    return records


def _engine(local: LocalCompiler, grammar: Any, filler: BitmaskFiller, ids, *, memo: bool):
    """Seconds of fills writing ``ids`` with the engine's matcher (``memo=False``: one
    that remembers nothing mid-escape)."""
    m = local.matcher(grammar)
    m.guard_lexes_strings = memo  # False: no memo is ever started
    guide = [RequestGuide(None, m)]
    total = 0.0
    for t in ids:
        t0 = time.perf_counter()
        filler.fill([0], guide)
        total += time.perf_counter() - t0
        if not m.accept_token(t):
            raise AssertionError(f"the engine's grammar rejected token {t}")
    return total


def _baseline(grammar: Any, vocab_rows: int, ids) -> float:
    """Seconds of fills writing ``ids`` with xgrammar's plain matcher, each into a fresh
    bitmask."""
    import xgrammar as xgr

    m = xgr.GrammarMatcher(grammar)
    total = 0.0
    for t in ids:
        t0 = time.perf_counter()
        mask = xgr.allocate_token_bitmask(1, vocab_rows)
        m.fill_next_token_bitmask(mask, 0)
        total += time.perf_counter() - t0
        if not m.accept_token(t):
            raise AssertionError(f"xgrammar's grammar rejected token {t}")
    return total


def table(records: list[Record]) -> str:
    head = (
        f"{'document':<15}{'grammar':<13}{'tokens':>7}{'engine':>11}{'no memo':>11}"
        f"{'n/e':>7}{'baseline':>11}{'b/e':>7}"
    )
    lines = [head, "-" * len(head)]
    by: dict[tuple[str, str], dict[str, Record]] = {}
    for r in records:
        by.setdefault((r.extra["document"], r.grammars[0]), {})[r.method] = r
    for (doc, kind), m in by.items():
        e, n, b = (m[x].median_us for x in ("engine", "no_memo", "baseline"))
        lines.append(
            f"{doc:<15}{kind:<13}{m['engine'].extra['tokens']:>7}{e / 1e3:>8.2f} ms"
            f"{n / 1e3:>8.2f} ms{n / e:>6.2f}x{b / 1e3:>8.2f} ms{b / e:>6.2f}x"
        )
    return "\n".join(lines)
