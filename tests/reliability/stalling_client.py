"""A front end that stalls its own process while its requests run: ``python -m
tests.reliability.stalling_client ADDRESS N MAX_TOKENS``. It starts N requests of
MAX_TOKENS tokens, prints ``running`` once each has produced output, and then, for
each line ``gil SECONDS`` read from stdin, holds the GIL for that long (every other
thread of the process, its IO thread included, stands still) and prints ``stalled``
with the longest stall its IO thread saw. A test may also stop it with SIGSTOP.
At the end: one ``ended ID REASON TOKENS ERROR`` line per request, then ``done``."""

from __future__ import annotations

import asyncio
import ctypes
import sys

from engine_core.client import EngineClient
from ipc import EngineCoreRequest, SamplingParams

from .support import PROMPT


def hold_the_gil(seconds: float) -> None:
    """Hold the GIL for ``seconds`` and let no other thread run, as a long call into a C
    extension that keeps it does, without spending the CPU a busy loop would: libc's
    ``sleep`` called through ``ctypes.PyDLL``, which keeps the GIL during the call. The
    switch interval (how long a thread waiting for the GIL waits before asking for it)
    is set past the stall, for the few bytecodes between the calls."""
    libc = ctypes.PyDLL(None)
    old = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 30)
    try:
        whole, rest = divmod(seconds, 1.0)
        for _ in range(int(whole)):
            libc.sleep(ctypes.c_uint(1))
        libc.usleep(ctypes.c_uint(int(rest * 1e6)))
    finally:
        sys.setswitchinterval(old)


async def main(address: str, n: int, max_tokens: int) -> None:
    client = await EngineClient.connect(address)
    started = asyncio.Event()
    seen: set[str] = set()
    lines: list[str] = []

    async def run(i: int) -> None:
        rid = f"stall-{i}"
        req = EngineCoreRequest(rid, PROMPT, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        tokens = 0
        try:
            async for out in client.generate(req):
                tokens += len(out.new_token_ids)
                seen.add(rid)
                if len(seen) == n:
                    started.set()
                if out.finished:
                    lines.append(f"ended {rid} {out.finish_reason} {tokens} {out.error}")
        except Exception as e:  # noqa: BLE001 - reported to the test
            lines.append(f"ended {rid} raised {type(e).__name__}: {e}")

    tasks = [asyncio.create_task(run(i)) for i in range(n)]
    await started.wait()
    print("running", flush=True)

    async def commands() -> None:
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            what, seconds = line.split()
            if what == "gil":
                hold_the_gil(float(seconds))
                await asyncio.sleep(0.5)  # the IO thread ticks again
                print(f"stalled {client.longest_stall_s:.1f}", flush=True)

    reader = asyncio.create_task(commands())
    await asyncio.gather(*tasks)
    reader.cancel()
    for line in lines:
        print(line, flush=True)
    print(f"dead {client.dead_reason}", flush=True)
    print("done", flush=True)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
