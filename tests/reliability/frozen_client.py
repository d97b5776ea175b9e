"""A front end that a test freezes and thaws: ``python -m tests.reliability.frozen_client
ADDRESS N`` starts N long requests, prints ``running`` once each has produced output,
then prints one ``ended ID REASON ERROR`` line per request as it ends, and ``done``."""

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
            f"frozen-{i}", PROMPT, SamplingParams(max_tokens=20_000, ignore_eos=True)
        )
        finals = []
        try:
            async for out in client.generate(req):
                seen.add(req.request_id)
                if len(seen) == n:
                    started.set()
                if out.finished:
                    finals.append(out)
        except Exception as e:  # noqa: BLE001 - reported to the test
            print(f"ended {req.request_id} raised {type(e).__name__}: {e}", flush=True)
            return
        for out in finals:
            print(f"ended {req.request_id} {out.finish_reason} {out.error}", flush=True)

    tasks = [asyncio.create_task(run(i)) for i in range(n)]
    await started.wait()
    print("running", flush=True)
    await asyncio.gather(*tasks)
    # and the engine serves this client again
    last = None
    async for out in client.generate(
        EngineCoreRequest("after-thaw", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True))
    ):
        last = out
    print(
        f"after-thaw {last.finish_reason if last else None} {last.error if last else None}",
        flush=True,
    )
    print("done", flush=True)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
