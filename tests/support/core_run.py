"""Requests run to the end through an `EngineCore` in this process (no sockets): the
real scheduler, compile workers, guides, masks and sampler, for tests where no
process boundary is under test."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine_core.engine import EngineCore
from ipc import EngineCoreOutput, EngineCoreRequest, FinishReason

CLIENT = b"test"


@dataclass
class Finished:
    token_ids: list[int] = field(default_factory=list)
    final: EngineCoreOutput | None = None

    @property
    def reason(self) -> FinishReason | None:
        return self.final.finish_reason if self.final is not None else None

    @property
    def error(self) -> str | None:
        return self.final.error if self.final is not None else None

    def text(self, tokenizer) -> str:
        """The output without its stop token, decoded strictly: bytes that are not
        valid UTF-8 fail the test, naming them and the tokens that wrote them."""
        ids = self.token_ids
        if ids and ids[-1] in tokenizer.stop_token_ids:
            ids = ids[:-1]
        data = tokenizer.decode_bytes(ids)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            at, near = 0, []
            for t in ids:
                b = tokenizer.decode_bytes([t])
                if at + len(b) > e.start - 4 and at < e.end + 4:
                    near.append((t, b))
                at += len(b)
            raise AssertionError(
                f"output is not UTF-8 ({e.reason} at byte {e.start}): "
                f"{data[max(0, e.start - 30) : e.end + 10]!r}; tokens there: {near}"
            ) from None


def run_to_end(
    core: EngineCore, requests: Sequence[EngineCoreRequest], timeout_s: float = 900.0
) -> list[Finished]:
    """Every request's tokens and final output, in the order given."""
    results = {r.request_id: Finished() for r in requests}

    def take(outputs: list) -> None:
        for _, out in outputs:
            res = results[out.request_id]
            res.token_ids += out.new_token_ids
            if out.finished:
                assert res.final is None, f"{out.request_id} finished twice"
                res.final = out

    for r in requests:
        take(core.add_request(CLIENT, r))
    deadline = time.monotonic() + timeout_s
    while core.has_work:
        if time.monotonic() > deadline:
            raise AssertionError("the engine did not finish its requests in time")
        if not core.has_runnable:  # grammars still compiling
            time.sleep(0.005)
        take(core.step())
    out = [results[r.request_id] for r in requests]
    missing = [r.request_id for r, f in zip(requests, out, strict=True) if f.final is None]
    assert not missing, f"no final output for {missing[:3]}"
    return out
