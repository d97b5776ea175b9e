"""Tokens per second and acceptance rate with drafts (``--draft-tokens K``) against
none, side by side.

Two workloads, each a batch of requests whose answer is a JSON object under its
schema (one object of eight string fields per request, drawn from a seeded generator):

- ``copy``: the prompt holds the record and asks for it as JSON; greedy. The scripted
  model writes the record back (so most of the answer is text of the prompt, which
  prompt lookup drafts); a model directory writes what its weights say.
- ``nomatch``: the same requests sampled at temperature 1 from a model that does not
  copy (the random model with ``--model scripted``, else the model directory's random
  weights): drafts are proposed and scored but almost never kept, which measures what
  drafts cost.

For each workload two engines run in this process, drafts off and on; each round runs
the whole batch on one then the other (alternating which goes first), from after the
grammar compiled until the last request ended. The table gives medians over the rounds:
output tokens per second, the ratio on/off (taken within each round, where the load of
a shared machine is alike for both, then its median), forward passes (steps of the
whole batch), and the share of proposed draft tokens that were kept.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from engine_core.config import EngineConfig
from engine_core.engine import EngineCore
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output.config import StructuredOutputConfig
from tokenization import load_tokenizer

from .common import Record, environment

FIELDS = ("name", "city", "country", "email", "phone", "company", "title", "street")
WORDS = (
    "amber river north lake stone field maple cedar harbor silver pine meadow valley "
    "summit ridge brook willow oak granite falcon"
).split()
SCHEMA = {
    "type": "object",
    "properties": {f: {"type": "string"} for f in FIELDS},
    "required": list(FIELDS),
    "additionalProperties": False,
}


def _record(rng: random.Random) -> dict[str, str]:
    return {f: " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for f in FIELDS}


def _requests(tok, n: int, seed: int) -> list[tuple[str, list[int], str]]:
    """(tag, prompt ids, the answer copying the record) per request."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rec = _record(rng)
        tag = f"[rec{i}]"
        prompt = (
            f"<|im_start|>user\n{tag} Here is a record: {json.dumps(rec)}\n"
            "Return it as a JSON object.<|im_end|>\n<|im_start|>assistant\n"
        )
        out.append((tag, tok.encode(prompt), json.dumps(rec)))
    return out


def _core(args, tok, tok_name, model: str, own: dict, drafts: int) -> EngineCore:
    config = EngineConfig(
        model=model,
        tokenizer=tok_name,
        runner_options=own,
        device=args.device,
        max_num_seqs=max(1, args.batch),
        draft_tokens=drafts,
        seed=args.seed,
        structured_output=StructuredOutputConfig(
            compile_workers=args.compile_workers, compile_timeout_s=60
        ),
        log_level="WARNING",
    )
    return EngineCore(config, tok)


def _round(core: EngineCore, reqs, tag: str, temperature: float, max_tokens: int):
    """(seconds, output tokens, steps, drafted, kept) of the whole batch."""
    spec = StructuredOutputSpec("json_schema", json.dumps(SCHEMA))
    for i, (rid, prompt, _) in enumerate(reqs):
        sp = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=i)
        assert core.add_request(b"bench", EngineCoreRequest(f"{tag}-{rid}", prompt, sp, spec)) == []
    while not all(r.grammar is None or r.grammar.done() for r in core.waiting):
        time.sleep(0.002)  # compiles are not timed (cached after the first round)
    steps0, drafted0, kept0 = core.num_steps, core.num_draft_tokens, core.num_accepted_drafts
    tokens = 0
    t0 = time.perf_counter()
    while core.has_work:
        for _, o in core.step():
            tokens += len(o.new_token_ids)
            if o.finished and o.finish_reason == FinishReason.ERROR:
                raise RuntimeError(f"{o.request_id}: {o.error}")
    return (
        time.perf_counter() - t0,
        tokens,
        core.num_steps - steps0,
        core.num_draft_tokens - drafted0,
        core.num_accepted_drafts - kept0,
    )


def run(args: argparse.Namespace) -> list[Record]:
    if args.model == "scripted":
        tok, tok_name = load_tokenizer("qwen3"), "qwen3"
    else:
        own_tok = Path(args.model, "tokenizer.json").is_file()
        tok_name = None if own_tok else "qwen3"
        tok = load_tokenizer(args.model if own_tok else "qwen3")
    reqs = _requests(tok, args.batch, args.seed)
    env = environment()
    records: list[Record] = []
    for workload in ("copy", "nomatch"):
        model, own, temperature = args.model, {}, 0.0 if workload == "copy" else 1.0
        if args.model == "scripted":
            if workload == "copy":
                rules = [{"match": t, "output": answer} for t, _, answer in reqs]
                script = Path(tempfile.mkdtemp(prefix="thinkgate-drafts-"), "script.json")
                script.write_text(json.dumps({"rules": rules, "default": ""}), encoding="utf-8")
                own = {"script": str(script)}
            else:
                model = "random"
            if args.forward_ms:
                own["forward_ms"] = args.forward_ms
        cores = {k: _core(args, tok, tok_name, model, own, k) for k in (0, args.draft_tokens)}
        got: dict[int, list] = {k: [] for k in cores}
        try:
            for rnd in range(args.warmup + args.rounds):
                order = list(cores) if rnd % 2 == 0 else list(cores)[::-1]
                for k in order:
                    res = _round(cores[k], reqs, f"{workload}{rnd}", temperature, args.max_tokens)
                    if rnd >= args.warmup:
                        got[k].append(res)
        finally:
            for core in cores.values():
                core.close()
        print(f"  drafts {workload}: {args.rounds} rounds", flush=True)
        off_rounds = [t / s for s, t, *_ in got[0]]
        for k, rows in got.items():
            tps = statistics.median(t / s for s, t, *_ in rows)
            drafted = sum(r[3] for r in rows)
            records.append(
                Record(
                    bench="drafts",
                    device=args.device,
                    vocab=tok.name,
                    vocab_rows=tok.vocab_rows,
                    batch_size=args.batch,
                    method=f"drafts_{k}",
                    median_us=statistics.median(s for s, *_ in rows) * 1e6,
                    p90_us=0.0,
                    per_row_median_us=0.0,
                    per_row_p90_us=0.0,
                    iters=len(rows),
                    warmup=args.warmup,
                    seed=args.seed,
                    grammars=[workload],
                    # paired: on over off within each round, then the median
                    ratio=statistics.median(
                        t / s / off for (s, t, *_), off in zip(rows, off_rounds, strict=True)
                    )
                    if k
                    else None,
                    env=env,
                    extra={
                        "workload": workload,
                        "draft_tokens": k,
                        "model": args.model,
                        "temperature": temperature,
                        "max_tokens": args.max_tokens,
                        "tokens_per_s": tps,
                        "tokens_per_s_rounds": [t / s for s, t, *_ in rows],
                        "passes": statistics.median(r[2] for r in rows),
                        "tokens_per_request": statistics.median(r[1] for r in rows) / args.batch,
                        "drafted": [r[3] for r in rows],
                        "kept": [r[4] for r in rows],
                        "acceptance": sum(r[4] for r in rows) / drafted if drafted else None,
                        "forward_ms": args.forward_ms,
                    },
                )
            )
    return records


def table(records: list[Record]) -> str:
    lines = [
        "| workload | draft tokens | tokens/s | on / off | passes/batch | tokens/request "
        "| drafts kept |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        x = r.extra
        acc = "" if x["acceptance"] is None else f"{x['acceptance']:.0%}"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append(
            f"| {x['workload']} | {x['draft_tokens']} | {x['tokens_per_s']:.0f} | {ratio} "
            f"| {x['passes']:g} | {x['tokens_per_request']:.1f} | {acc} |"
        )
    return "\n".join(lines)
