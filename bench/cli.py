"""thinkgate bench fill|apply|sample|e2e|throughput|jump|drafts|latency|http|startup|strings|
escapes: measure the engine's structured-output paths side by side with the usual way,
the engine process around the model, its throughput against transformers, its start-up, and the HTTP
server. See bench/README.md."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from .names import GRAMMARS, LOGITS, MIXES, VOCABS

#: each bench and the module that runs it: ``run(args)`` gives its records; its
#: ``table(records)`` and ``plot(records, path)``, where it has them, show them
MODULES = {
    "fill": "fill",
    "apply": "apply",
    "sample": "sampling",
    "e2e": "e2e",
    "throughput": "throughput",
    "jump": "jump",
    "drafts": "drafts",
    "latency": "latency",
    "http": "http_api",
    "startup": "startup",
    "strings": "strings",
    "escapes": "escapes",
}
#: benches of an engine line against a baseline line per size (`pair_table`, `pair_plot`)
PAIRED = ("fill", "apply")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _names(choices: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        names = [x for x in text.split(",") if x]
        unknown = [x for x in names if x not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose among {', '.join(choices)}")
        return names

    return parse


def _common(p: argparse.ArgumentParser, *, iters: int, warmup: int) -> None:
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    p.add_argument(
        "--torch-threads", type=int, help="torch intra-op threads (default: torch's own)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of states, logits and uniforms")
    p.add_argument("--json", metavar="PATH", help="write the records here")
    p.add_argument("--plot", metavar="PATH", help="draw a PNG here")
    p.add_argument("--iters", type=int, default=iters, help=f"timed iterations (default {iters})")
    p.add_argument(
        "--warmup", type=int, default=warmup, help=f"untimed first iterations (default {warmup})"
    )


def _compile_workers(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument(
        "--compile-workers",
        type=int,
        default=default,
        help=f"the engine's grammar compile worker processes (default {default}; 0: compile "
        "in the engine process)",
    )


def _pairs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--vocabs",
        type=_names(VOCABS),
        default=list(VOCABS),
        help="comma-separated: qwen3,o200k_harmony (default both)",
    )
    p.add_argument(
        "--batch-sizes",
        type=_ints,
        default=[1, 8, 32, 128, 256, 512],
        help="comma-separated (default 1,8,32,128,256,512)",
    )
    p.add_argument(
        "--grammars",
        type=_names(GRAMMARS),
        default=list(GRAMMARS),
        help=f"rows take these in turn (default {','.join(GRAMMARS)})",
    )
    p.add_argument(
        "--fill-threads",
        type=int,
        default=0,
        help="threads of the engine's batched fill (default 0: as the engine picks them, "
        "one per two CPUs, 2 to 8)",
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="thinkgate bench", description=__doc__)
    sub = ap.add_subparsers(dest="bench", required=True)
    p = sub.add_parser(
        "fill",
        help="bitmask fill per step: the engine vs xgrammar's default grammars filled by a "
        "per-row loop into a fresh mask (what a vLLM user runs)",
    )
    _common(p, iters=40, warmup=5)
    _pairs(p)
    p.add_argument(
        "--peer-python",
        metavar="PATH",
        help="side by side with vLLM's grammar_bitmask instead: the python of a venv that "
        "holds vLLM (bench/README.md); qwen3, four JSON schemas, interleaved rounds",
    )
    p.add_argument(
        "--peer-tokenizer",
        metavar="DIR",
        help="the peer's Qwen3 tokenizer folder (default: qwen3-tokenizer beside its venv)",
    )
    p.add_argument("--rounds", type=int, default=5, help="with --peer-python: rounds (default 5)")
    p.add_argument(
        "--one-row-states",
        type=int,
        default=32,
        metavar="N",
        help="with --peer-python: then one row at each of the first N states, vLLM and the "
        "engine in turn (default 32; 0: none)",
    )
    p.add_argument(
        "--walk",
        action="store_true",
        help="decode: before each timed step every row accepts its document's next token "
        "(untimed), as in serving; without it, every step fills the same states",
    )
    p = sub.add_parser(
        "apply",
        help="apply + sample per step: engine vs apply_token_bitmask_inplace "
        "+ multinomial(softmax)",
    )
    _common(p, iters=10, warmup=2)
    _pairs(p)
    p = sub.add_parser(
        "sample",
        help="one sampling step per mix of settings (plain, top-k, top-p, mixed): engine "
        "vs a full sort of the vocabulary for top-k / top-p",
    )
    _common(p, iters=5, warmup=1)
    p.add_argument(
        "--vocabs",
        type=_names(VOCABS),
        default=["qwen3"],
        help="comma-separated: qwen3,o200k_harmony (default qwen3)",
    )
    p.add_argument(
        "--batch-sizes", type=_ints, default=[8, 32, 128], help="comma-separated (default 8,32,128)"
    )
    p.add_argument(
        "--mixes",
        type=_names(MIXES),
        default=list(MIXES),
        help=f"comma-separated (default {','.join(MIXES)})",
    )
    p.add_argument(
        "--logits",
        type=_names(LOGITS),
        default=list(LOGITS),
        help="normal (flat: top-p spans thousands of ids) and/or peaked (Zipf-like)",
    )
    p = sub.add_parser(
        "e2e",
        help="the engine process with the random model or a model directory: step time, "
        "tokens/s and the structured-output share per request mix",
    )
    _common(p, iters=100, warmup=20)
    _compile_workers(p, 2)
    p.add_argument(
        "--model",
        metavar="DIR",
        help="a model directory run by the batched runner (default: the random model)",
    )
    p.add_argument("--dtype", default="auto", help="of --model (default auto)")
    p.add_argument(
        "--engine-torch-threads", type=int, help="torch intra-op threads of the engine process"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        help="of each request (default 4096; 384 with --model, whose attention grows with it)",
    )
    p.add_argument(
        "--batch-sizes",
        type=_ints,
        help="running rows, one engine each (default 256; 1,32,128,256 with --model)",
    )
    p.add_argument(
        "--forward-ms",
        type=float,
        default=20.0,
        help="fixed cost per forward of the random model (default 20)",
    )
    p.add_argument(
        "--constrained",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.0, 0.5, 1.0],
        help="fractions of constrained requests (default 0,0.5,1)",
    )
    p.add_argument(
        "--thinking",
        type=lambda s: [x == "1" for x in s.split(",")],
        default=[False, True],
        help="0,1: without and with half of the requests thinking (default both)",
    )
    p.add_argument(
        "--grammars",
        type=_names(GRAMMARS),
        default=list(GRAMMARS),
        help="constrained requests take these in turn",
    )
    p = sub.add_parser(
        "throughput",
        help="tokens/s of the engine against transformers' generate (padded batches, "
        "continuous batching, xgrammar's logits processor) on one model directory",
    )
    _common(p, iters=3, warmup=1)
    _compile_workers(p, 2)
    p.add_argument("--model", metavar="DIR", required=True, help="a model directory")
    p.add_argument(
        "--engine-torch-threads", type=int, help="torch intra-op threads of the engine process"
    )
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    p.add_argument("--requests", type=int, default=64, help="prompts per run (default 64)")
    p.add_argument("--batch-size", type=int, default=32, help="running rows (default 32)")
    p.add_argument("--new-tokens", type=int, default=64, help="per request (default 64)")
    p.add_argument("--min-prompt", type=int, default=24, help="prompt tokens (default 24)")
    p.add_argument("--max-prompt", type=int, default=96, help="prompt tokens (default 96)")
    p.add_argument(
        "--modes",
        type=_names(("unconstrained", "constrained")),
        default=["unconstrained", "constrained"],
        help="unconstrained,constrained (default both)",
    )
    p.add_argument(
        "--grammars",
        type=_names(GRAMMARS),
        default=list(GRAMMARS),
        help="constrained requests take these in turn",
    )
    p = sub.add_parser(
        "jump",
        help="forward passes per forced tool call with and without jump forward, on one "
        "model directory",
    )
    _common(p, iters=0, warmup=0)
    _compile_workers(p, 1)
    p.add_argument(
        "--model",
        metavar="DIR",
        required=True,
        help="a model directory, or scripted (writes each call with example arguments)",
    )
    p.add_argument("--calls", type=int, default=8, help="calls per case, at most 8 (default 8)")
    p.add_argument("--max-tokens", type=int, default=128, help="per call (default 128)")
    p.add_argument(
        "--string-max-length",
        type=int,
        metavar="N",
        help="give the tools' free string parameters a maxLength of N: a random-weight "
        "model then ends its values as a trained one would, instead of at --max-tokens",
    )
    p = sub.add_parser(
        "drafts",
        help="tokens per second and drafts kept with --draft-tokens against none, on a "
        "JSON answer that copies its prompt and on sampled answers drafts do not match",
    )
    _common(p, iters=0, warmup=1)
    _compile_workers(p, 1)
    p.add_argument(
        "--model",
        metavar="DIR",
        required=True,
        help="a model directory, or scripted (copies the record; the random model samples)",
    )
    p.add_argument("--draft-tokens", type=int, default=4, help="K of the run with drafts (4)")
    p.add_argument("--batch", type=int, default=8, help="requests run together (default 8)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per engine (default 5)")
    p.add_argument("--max-tokens", type=int, default=160, help="per request (default 160)")
    p.add_argument(
        "--forward-ms", type=float, default=0.0, help="scripted/random: each pass sleeps this long"
    )
    p = sub.add_parser(
        "latency",
        help="the engine process: 1-token round trip through the client, steps per second",
    )
    _common(p, iters=0, warmup=20)
    _compile_workers(p, 2)
    p.add_argument(
        "--requests", type=int, default=1000, help="1-token requests timed (default 1000)"
    )
    p.add_argument("--batch-sizes", type=_ints, default=[1, 256], help="default 1,256")
    p.add_argument("--seconds", type=float, default=10.0, help="steps counted over (default 10)")
    p = sub.add_parser(
        "http",
        help="the HTTP server with the random model: requests per second and p50/p99 latency "
        "of 1-token chat completions and 64-token streamed completions",
    )
    _common(p, iters=0, warmup=20)
    _compile_workers(p, 2)
    p.add_argument(
        "--requests", type=int, default=400, help="timed requests per setting (default 400)"
    )
    p.add_argument(
        "--concurrency", type=_ints, default=[1, 64], help="requests in flight (default 1,64)"
    )
    p.add_argument(
        "--stream-tokens", type=int, default=64, help="tokens of each streamed completion"
    )
    p = sub.add_parser(
        "startup",
        help="a spawned engine: handshake, first plain and first JSON request, with the CPU "
        "its process tree spent by then; and where start-up time goes, phase by phase",
    )
    _common(p, iters=3, warmup=0)
    _compile_workers(p, 2)
    p.add_argument(
        "--vocabs",
        type=_names(VOCABS),
        default=["qwen3"],
        help="comma-separated: qwen3,o200k_harmony (default qwen3)",
    )
    p = sub.add_parser(
        "strings",
        help="decoding documents token by token: how much of the fill time is spent inside "
        "JSON strings whose parser state (and mask) repeats from the string's previous step",
    )
    _common(p, iters=0, warmup=0)
    p.add_argument("--docs", type=int, default=60, help="documents per grammar (default 60)")
    p = sub.add_parser(
        "escapes",
        help="decoding JSON strings full of escapes (a program, Windows paths, text as \\u "
        "escapes) a row at a time: the engine, the engine remembering nothing mid-escape, "
        "and xgrammar's default",
    )
    _common(p, iters=9, warmup=1)
    return ap


def _check_plot(args: argparse.Namespace) -> str | None:
    """Why ``--plot`` cannot work, before anything runs (None: it can)."""
    if not args.plot:
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return (
            "--plot needs matplotlib, which is not installed: pip install 'thinkgate[bench]' "
            "(or leave out --plot)"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    problem = _check_plot(args)
    if problem:
        print(f"thinkgate bench {args.bench}: error: {problem}", file=sys.stderr)
        return 2
    import torch

    from .common import cuda_missing, device_name, pair_plot, pair_table, write_json

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    why = cuda_missing(args.device)
    if why:
        print(f"thinkgate bench {args.bench}: {why}")
        return 0
    if args.bench in ("latency", "http"):
        timed = f"{args.requests} requests"
    elif args.bench == "strings":
        timed = f"{args.docs} documents per grammar, every token's fill timed"
    else:
        timed = f"{args.iters} timed iterations after {args.warmup} warm-up"
    print(
        f"thinkgate bench {args.bench}: device {device_name(args.device)}, seed {args.seed}, "
        f"{timed}",
        flush=True,
    )
    t0 = time.perf_counter()
    name = "peer" if args.bench == "fill" and args.peer_python else MODULES[args.bench]
    module = importlib.import_module(f".{name}", __package__)
    records = module.run(args)
    table = getattr(module, "table", pair_table if name in PAIRED else None)
    if table is not None:
        print(table(records))
    if args.plot:
        if name in PAIRED:
            title = f"bench {args.bench}: per step, {', '.join(args.grammars)}"
            pair_plot(records, args.plot, title)
        elif hasattr(module, "plot"):
            module.plot(records, args.plot)
    if args.json:
        write_json(args.json, records)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0
