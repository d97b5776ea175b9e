"""Many streamed requests at once through HTTP: every one completes exactly once, with
all its tokens, and the engine holds nothing afterwards."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai

N = 500
CONCURRENCY = 64
TOKENS = 4


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=60).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_500_streams_at_64_concurrent_each_complete_once(random_server):
    key = 'thinkgate_requests_total{endpoint="chat",finish_reason="length"}'
    before = _metrics(random_server.url).get(key, 0.0)

    async def one(c: openai.AsyncOpenAI, sem: asyncio.Semaphore, i: int) -> tuple[int, int, int]:
        async with sem:
            stream = await c.chat.completions.create(
                model="random",
                messages=[{"role": "user", "content": f"request {i}"}],
                max_tokens=TOKENS,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}},
            )
            finishes, usage = 0, None
            async for chunk in stream:
                for ch in chunk.choices:
                    if ch.finish_reason is not None:
                        finishes += 1
                        assert ch.finish_reason == "length"
                usage = chunk.usage or usage
            assert usage is not None
            return i, finishes, usage.completion_tokens

    async def main():
        sem = asyncio.Semaphore(CONCURRENCY)
        async with openai.AsyncOpenAI(
            base_url=random_server.base_url, api_key="none", max_retries=0, timeout=300
        ) as c:
            return await asyncio.gather(*(one(c, sem, i) for i in range(N)))

    t0 = time.monotonic()
    results = asyncio.run(main())
    elapsed = time.monotonic() - t0
    assert sorted(i for i, _, _ in results) == list(range(N))
    assert all(f == 1 for _, f, _ in results), "a stream without, or with two, finish reasons"
    assert all(n == TOKENS for _, _, n in results)
    after = _metrics(random_server.url)
    assert after[key] - before == N
    assert after["thinkgate_requests_running"] == 0 and after["thinkgate_requests_waiting"] == 0
    print(f"{N} streams at {CONCURRENCY} concurrent: {elapsed:.1f} s, {N / elapsed:.0f}/s")
