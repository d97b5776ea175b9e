"""Load: thousands of requests at 256 concurrent through one engine: half constrained
(JSON schemas, regexes, choices, EBNF, a structural tag of tool calls), a quarter
thinking. Every request ends exactly once; at least 90% of the constrained ones stop
on their own, and every one of those is valid; afterwards nothing is left in the
engine (requests, guides, compiles); its memory growth is reported and bounded.

Thinking uses the random-logits model with prompts that leave the thinking open
(``<think>\\n`` at the end, ``reasoning_ended=False``), and a reasoning budget of 4-32
tokens that forces ``</think>`` when the model has not written it: every step of
the thought and of the answer is adversarial, so only the gate and the masks keep
the answer valid. The scripted model would show the gate on outputs it controls,
which the suite under tests/engine already does; here the point is volume with
outputs nobody chose."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass

import jsonschema
import pytest

from ipc import EngineCoreRequest, FinishReason, SamplingParams, StructuredOutputSpec
from reasoning import create_reasoning_parser
from tests.support.grammars import ARITHMETIC, hermes_calls_valid, hermes_tag, is_arithmetic

from .conftest import serve
from .support import SCHEMA, rss_kib

CONCURRENCY = 256
REGEX = r"[A-Z]{2}-\d{3,5}(\.[a-z]{1,4})?"
CHOICES = ["alpha", "beta", "gamma delta"]
TOOLS = [
    {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    }
]


SPECS = {
    "schema": (
        StructuredOutputSpec("json_schema", json.dumps(SCHEMA)),
        lambda s: jsonschema.validate(json.loads(s), SCHEMA) is None,
    ),
    "regex": (StructuredOutputSpec("regex", REGEX), lambda s: re.fullmatch(REGEX, s) is not None),
    "choice": (StructuredOutputSpec("choice", json.dumps(CHOICES)), lambda s: s in CHOICES),
    "ebnf": (StructuredOutputSpec("grammar", ARITHMETIC), is_arithmetic),
    "tools": (
        StructuredOutputSpec("structural_tag", json.dumps(hermes_tag(TOOLS))),
        lambda t: hermes_calls_valid(t, TOOLS),
    ),
}
# Eight slots: 0-3 constrained (half), 0 and 4 thinking (a quarter).
SLOTS = [
    ("schema", True),
    ("schema", False),
    ("regex", False),
    ("rotate", False),
    ("free", True),
    ("free", False),
    ("free", False),
    ("free", False),
]
ROTATE = ["choice", "ebnf", "tools", "schema"]


@dataclass
class Result:
    kind: str
    thinking: bool
    ids: list[int]
    finish: FinishReason | None
    error: str | None
    finals: int


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve(
        [
            "--model",
            "random",
            "--reasoning-parser",
            "qwen3",
            "--max-num-seqs",
            str(CONCURRENCY),
            "--seed",
            "41",
            "--compile-workers",
            "0",
            "--compile-timeout-s",
            "60",
        ],
        tmp_path_factory,
        "load",
    )


def run_load(served, n: int, seed: int) -> dict:
    client = served.client
    tok = client.tokenizer()
    parser = create_reasoning_parser("qwen3", tok)
    answer_prompt = tok.encode(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n\n</think>\n\n"
    )
    think_prompt = tok.encode(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert parser.reasoning_ended(answer_prompt) and not parser.reasoning_ended(think_prompt)
    rng = random.Random(seed)
    plan = []
    for i in range(n):
        kind, thinking = SLOTS[i % len(SLOTS)]
        if kind == "rotate":
            kind = ROTATE[(i // len(SLOTS)) % len(ROTATE)]
        so = SPECS[kind][0] if kind != "free" else None
        sp = SamplingParams(
            max_tokens=rng.randint(8, 48) if kind == "free" else 384, seed=seed * 100_000 + i
        )
        plan.append(
            (
                kind,
                thinking,
                EngineCoreRequest(
                    f"load-{seed}-{i}",
                    think_prompt if thinking else answer_prompt,
                    sp,
                    so,
                    reasoning_ended=not thinking,
                    reasoning_budget=rng.randint(4, 32) if thinking else None,
                ),
            )
        )

    async def body():
        results: list[Result] = []
        queue = iter(plan)

        async def lane():
            for kind, thinking, req in queue:
                ids: list[int] = []
                finals = 0
                last = None
                async for out in client.generate(req):
                    ids += out.new_token_ids
                    if out.finished:
                        finals += 1
                        last = out
                results.append(
                    Result(
                        kind,
                        thinking,
                        ids,
                        last.finish_reason if last else None,
                        last.error if last else None,
                        finals,
                    )
                )

        await asyncio.gather(*(lane() for _ in range(CONCURRENCY)))
        return results

    pid = served.engine.pid
    before = rss_kib(pid)
    t0 = time.monotonic()
    results = served.run(body, 3600)
    took = time.monotonic() - t0

    async def settled():
        for _ in range(200):
            h = await client.health()
            if not (
                h.num_requests or h.num_guides or h.num_compiling or h.num_running or h.num_waiting
            ):
                return h
            await asyncio.sleep(0.05)
        return h

    health = served.run(settled)
    after = rss_kib(pid)

    assert len(results) == n
    finishes = Counter(str(r.finish) for r in results)
    assert all(r.finals == 1 for r in results), "a request did not end exactly once"
    assert not [r for r in results if r.finish not in (FinishReason.STOP, FinishReason.LENGTH)], (
        finishes
    )
    constrained = [r for r in results if r.kind != "free"]
    stopped = [r for r in constrained if r.finish == FinishReason.STOP]
    invalid = []
    for r in stopped:
        reasoning, content = parser.split(
            r.ids[:-1], think_prompt if r.thinking else answer_prompt, not r.thinking
        )
        text = content or ""
        if r.thinking:
            text = text.lstrip(
                "\n"
            )  # the separator after </think> is the family's, not the answer's
        try:
            ok = SPECS[r.kind][1](text)
        except (ValueError, KeyError, AssertionError, jsonschema.ValidationError):
            ok = False
        if not ok:
            invalid.append((r.kind, r.thinking, text[:200]))
    by_kind = Counter((r.kind, r.thinking) for r in stopped)
    figures = {
        "requests": n,
        "seconds": round(took, 1),
        "requests/s": round(n / took, 1),
        "finishes": dict(finishes),
        "constrained": len(constrained),
        "constrained stopped": len(stopped),
        "thinking": sum(r.thinking for r in results),
        "tokens": sum(len(r.ids) for r in results),
        "stopped by kind": {
            f"{k}{' (thinking)' if t else ''}": v for (k, t), v in sorted(by_kind.items())
        },
        "invalid": len(invalid),
        "engine RSS MiB": (round(before / 1024), round(after / 1024)),
        "left in the engine": (
            health.num_requests,
            health.num_guides,
            health.num_compiling,
            health.num_running,
            health.num_waiting,
        ),
    }
    print(f"\nload {n}: {figures}")
    assert invalid == [], invalid[:5]
    assert len(stopped) >= 0.9 * len(constrained), figures
    assert (health.num_requests, health.num_guides, health.num_compiling) == (0, 0, 0), health
    assert (health.num_running, health.num_waiting) == (0, 0), health
    assert after - before < 1024 * 1024, figures  # 1 GiB
    return figures


def _twice(served, first_n: int, second_n: int) -> None:
    """``first_n`` requests, then ``second_n`` more: the first run's growth is warm-up
    (buffers sized for the batch, allocator arenas, cached grammars); the second must
    find the memory where the first left it."""
    first = run_load(served, first_n, seed=2)
    second = run_load(served, second_n, seed=3)
    (idle, after_first), (_, after_second) = first["engine RSS MiB"], second["engine RSS MiB"]
    print(f"engine RSS (MiB): {idle} idle, {after_first} after the first run, {after_second} after")
    assert after_second - after_first < 64, (first, second)


def test_load_400_then_200_more(served):
    """The scaled-down run kept in the default suite (more requests than the engine
    runs at once, so that they queue and join as others leave; about 12 s here)."""
    _twice(served, 400, 200)


@pytest.mark.slow
def test_load_5000_then_1000_more(served):
    """The full run: 100-150 s here for the 5,000, depending on what else runs."""
    _twice(served, 5000, 1000)
