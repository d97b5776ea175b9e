"""Forward passes per forced tool call, with and without jump forward.

One model directory (``thinkgate make-model``), or ``scripted`` (the scripted model
writing each call with example arguments, so that both runs write the same text),
greedy, one request at a time, so that
every engine step is one forward pass of that request alone. Per family (hermes,
qwen3_coder) and tool choice (named: each of the eight tools of `states.TOOLS` in
turn; "required": the same prompts, any tool), the engine runs each call twice, jump
forward off then on, in two engines side by side in this process; a call's passes are
its steps until its final output. The table gives per case the median passes of a
call without and with jump forward, their ratio, the tokens per pass, and the share of
calls that ended by their grammar (the rest reached ``--max-tokens``): a random-weight
model writes the argument values of its own, the forced text is the grammar's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from engine_core.config import EngineConfig
from engine_core.engine import EngineCore
from frontend.tool_formats import FunctionTool, create_tool_format
from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from structured_output.config import StructuredOutputConfig
from tokenization import load_tokenizer

from . import states
from .common import Record, environment

FAMILIES = ("hermes", "qwen3_coder")


def _example(schema: dict[str, Any]) -> Any:
    """A plain value of ``schema`` (its required properties only)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _example(props[k]) for k in schema.get("required", [])}
    if kind == "array":
        return [_example(schema.get("items", {"type": "string"}))]
    return {"string": "Paris", "integer": 3, "number": 2.5, "boolean": True}.get(kind)


def bound_strings(schema: Any, n: int) -> Any:
    """``schema`` with ``maxLength: n`` on every string schema (``"type": "string"``;
    a list of types is left alone: xgrammar cannot bound it) without an enum, a const
    or a length bound of its own, nested ones too."""
    if isinstance(schema, list):
        return [bound_strings(s, n) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bound_strings(v, n) for k, v in schema.items()}
    if schema.get("type") == "string" and not {"enum", "const", "maxLength"} & schema.keys():
        out["maxLength"] = n
    return out


def _script_text(fam: str, tool: FunctionTool) -> str:
    args = _example(tool.schema)
    if fam == "hermes":
        call = json.dumps({"name": tool.name, "arguments": args})
        return f"<tool_call>\n{call}\n</tool_call>"
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<tool_call>\n<function={tool.name}>\n{params}</function>\n</tool_call>"


def _core(args: argparse.Namespace, tokenizer, jump: bool, script: str | None) -> EngineCore:
    if script is not None:
        model, tok_name, own_opts = "scripted", "qwen3", {"script": script}
    else:
        own = Path(args.model, "tokenizer.json").is_file()
        model, tok_name, own_opts = args.model, None if own else "qwen3", {}
    config = EngineConfig(
        model=model,
        tokenizer=tok_name,
        runner_options=own_opts,
        device=args.device,
        max_num_seqs=1,
        jump_forward=jump,
        seed=args.seed,
        structured_output=StructuredOutputConfig(
            compile_workers=args.compile_workers, compile_timeout_s=60
        ),
        log_level="WARNING",
    )
    return EngineCore(config, tokenizer)


def _call(core: EngineCore, req: EngineCoreRequest) -> tuple[int, int, bool, float]:
    """(passes, tokens, ended by the grammar, seconds) of one request alone."""
    assert core.add_request(b"bench", req) == []
    steps = tokens = 0
    finish = None
    t0 = time.perf_counter()
    while finish is None:
        if not core.has_runnable:  # its grammar is compiling
            time.sleep(0.002)
            continue
        steps += 1
        for _, o in core.step():
            tokens += len(o.new_token_ids)
            if o.finished:
                finish = o.finish_reason
                if o.error:
                    raise RuntimeError(f"{req.request_id}: {o.error}")
    return steps, tokens, finish == FinishReason.STOP, time.perf_counter() - t0


def run(args: argparse.Namespace) -> list[Record]:
    n = args.string_max_length
    tools = [
        FunctionTool(t["name"], bound_strings(t["parameters"], n) if n else t["parameters"])
        for t in states.TOOLS
    ]
    script = None
    if args.model == "scripted":
        tok = load_tokenizer("qwen3")
        rules = [
            {"match": f"[{fam} {t.name}]", "output": _script_text(fam, t)}
            for fam in FAMILIES
            for t in tools
        ]
        script = str(Path(tempfile.mkdtemp(prefix="thinkgate-jump-"), "script.json"))
        Path(script).write_text(json.dumps({"rules": rules, "default": ""}), encoding="utf-8")
    else:
        own = Path(args.model, "tokenizer.json").is_file()
        tok = load_tokenizer(args.model if own else "qwen3")
    cores = {jump: _core(args, tok, jump, script) for jump in (False, True)}
    env = environment()
    records: list[Record] = []
    try:
        for fam in FAMILIES:
            fmt = create_tool_format(fam, tok)
            for choice in ("named", "required"):
                got: dict[bool, list[tuple[int, int, bool, float]]] = {False: [], True: []}
                for k, tool in enumerate(tools[: args.calls]):
                    named = tool.name if choice == "named" else None
                    spec = fmt.constraint(tools, named=named, parallel=False)
                    prompt = tok.encode(
                        f"<|im_start|>user\n[{fam} {tool.name}] call {k}.<|im_end|>\n"
                        "<|im_start|>assistant\n"
                    )
                    for jump, core in cores.items():
                        req = EngineCoreRequest(
                            f"{fam}-{choice}-{k}-{int(jump)}",
                            prompt,
                            SamplingParams(temperature=0.0, max_tokens=args.max_tokens),
                            StructuredOutputSpec(spec.kind.value, spec.value),
                        )
                        got[jump].append(_call(core, req))
                print(f"  jump {fam} {choice}: {len(got[True])} calls", flush=True)
                off = statistics.median(p for p, *_ in got[False])
                for jump in (False, True):
                    rows = got[jump]
                    passes = [p for p, *_ in rows]
                    med = statistics.median(passes)
                    records.append(
                        Record(
                            bench="jump",
                            device=args.device,
                            vocab=tok.name,
                            vocab_rows=tok.vocab_rows,
                            batch_size=1,
                            method="jump_forward" if jump else "sampled",
                            median_us=statistics.median(s for *_, s in rows) * 1e6,
                            p90_us=0.0,
                            per_row_median_us=0.0,
                            per_row_p90_us=0.0,
                            iters=len(rows),
                            warmup=0,
                            seed=args.seed,
                            grammars=[f"{fam}_{choice}"],
                            ratio=off / med if jump else None,
                            env=env,
                            extra={
                                "family": fam,
                                "tool_choice": choice,
                                "median_passes": med,
                                "passes": passes,
                                "tokens": [t for _, t, _, _ in rows],
                                "tokens_per_pass": sum(t for _, t, _, _ in rows) / sum(passes),
                                "ended": sum(e for _, _, e, _ in rows) / len(rows),
                                "max_tokens": args.max_tokens,
                                "string_max_length": args.string_max_length,
                                "model": args.model,
                            },
                        )
                    )
    finally:
        for core in cores.values():
            core.close()
    return records


def table(records: list[Record]) -> str:
    lines = [
        "| case | passes/call off | passes/call on | off / on | fewer | tokens/pass on "
        "| ended by grammar, off / on |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    by: dict[str, dict[str, Record]] = {}
    for r in records:
        by.setdefault(r.grammars[0], {})[r.method] = r
    for case, m in by.items():
        off, on = m["sampled"].extra, m["jump_forward"].extra
        lines.append(
            f"| {case} | {off['median_passes']:g} | {on['median_passes']:g} "
            f"| {m['jump_forward'].ratio:.2f}x "
            f"| {1 - on['median_passes'] / off['median_passes']:.0%} "
            f"| {on['tokens_per_pass']:.2f} | {off['ended']:.0%} / {on['ended']:.0%} |"
        )
    return "\n".join(lines)
