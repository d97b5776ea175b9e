"""A front end that a test kills: ``python -m tests.reliability.dying_client ADDRESS N``
connects to the engine, starts N long requests, prints ``running`` once each has
produced output, then waits to be killed (SIGKILL: no GOODBYE, no abort)."""

from __future__ import annotations

import asyncio
import sys

from engine_core.client import EngineClient
from ipc import EngineCoreRequest, SamplingParams

from .support import PROMPT


async def main(address: str, n: int) -> None:
    client = await EngineClient.connect(address)
    started = asyncio.Event()
    seen: set[str] = set()

    async def run(i: int) -> None:
        req = EngineCoreRequest(
            f"doomed-{i}", PROMPT, SamplingParams(max_tokens=20_000, ignore_eos=True)
        )
        async for _ in client.generate(req):
            seen.add(req.request_id)
            if len(seen) == n:
                started.set()

    tasks = [asyncio.create_task(run(i)) for i in range(n)]
    await started.wait()
    print("running", flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
