"""The engine's log-probabilities, kept in step with the text and put in the API's
shapes.

The engine sends one entry per new token (`ipc.TokenLogprobs`). The front end holds
tokens back (a possible stop string) and splits them into thinking and answer, so the
entries wait in a `LogprobQueue` until their tokens are placed: an entry is reported
when its token's text is, and dropped with it (the stop token, what follows a stop
string). With the thinking left out (``include_reasoning: false``), `AnswerLogprobs`
keeps the entries of the answer's tokens only.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ipc import TokenLogprobs
from reasoning import AnswerStart, Phase

from .protocol import CompletionLogprobs, TokenLogprob, TopLogprob


class Entry(NamedTuple):
    token_id: int
    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]


class LogprobQueue:
    """Entries of the tokens not placed yet, oldest first."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[Entry] = deque()

    def push(self, ids: Sequence[int], lp: TokenLogprobs | None) -> None:
        """Entries for ``ids`` (the engine's new ids, in order)."""
        if lp is None or len(lp.sampled) != len(ids):
            raise ValueError("the engine sent no log-probabilities for these tokens")
        tops = lp.top_ids or [[] for _ in ids]
        top_lps = lp.top_logprobs or [[] for _ in ids]
        for t, v, ti, tl in zip(ids, lp.sampled, tops, top_lps, strict=True):
            self._q.append(Entry(t, v, ti, tl))

    def drop_last(self) -> None:
        """The newest token is not part of the text (the stop token)."""
        self._q.pop()

    def take(self, n: int) -> list[Entry]:
        """The oldest ``n`` entries."""
        q = self._q
        return [q.popleft() for _ in range(min(n, len(q)))]

    def clear(self) -> None:
        self._q.clear()


class AnswerLogprobs:
    """Keeps the entries of answer tokens only, as the reasoning tracker places them:
    tokens fed while the thinking may still open wait until the tracker decides."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: list[Entry] = []

    def push(
        self, entries: list[Entry], before: Phase, start: AnswerStart | None, after: Phase
    ) -> list[Entry]:
        """``entries`` of the ids of one `split_bytes` call, the tracker's phase before
        and after it and the answer start it returned; the answer's entries."""
        if before == Phase.ANSWER:
            return entries
        self._pending += entries
        if after == Phase.ANSWER:
            n = len(entries) - start.index if start is not None else len(entries)
            out = self._pending[len(self._pending) - n :] if n > 0 else []
            self._pending = []
            return out
        if after == Phase.THINKING:
            self._pending = []
        return []

    def finish(self, phase: Phase) -> list[Entry]:
        """An output that ends still undecided is all answer."""
        out = self._pending if phase == Phase.UNDECIDED else []
        self._pending = []
        return out


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def chat_logprobs(
    entries: Sequence[Entry], token_bytes: Callable[[int], bytes]
) -> list[TokenLogprob]:
    """The chat API's ``logprobs.content`` items."""
    out: list[TokenLogprob] = []
    for e in entries:
        b = token_bytes(e.token_id)
        top = [
            TopLogprob(token=_text(tb), logprob=v, bytes=list(tb))
            for tb, v in (
                (token_bytes(t), v) for t, v in zip(e.top_ids, e.top_logprobs, strict=True)
            )
        ]
        out.append(TokenLogprob(token=_text(b), logprob=e.logprob, bytes=list(b), top_logprobs=top))
    return out


class CompletionLogprobMaker:
    """The completions API's ``logprobs`` object, piece by piece: ``text_offset`` counts
    the characters of the text before each token, over the whole completion."""

    __slots__ = ("_tb", "_top", "_dec", "_chars")

    def __init__(self, token_bytes: Callable[[int], bytes], top: int) -> None:
        self._tb = token_bytes
        self._top = top
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chars = 0

    def make(self, entries: Sequence[Entry]) -> CompletionLogprobs:
        tokens: list[str] = []
        values: list[float] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for e in entries:
            b = self._tb(e.token_id)
            offsets.append(self._chars)
            self._chars += len(self._dec.decode(b))
            tokens.append(_text(b))
            values.append(e.logprob)
            tops.append(
                {_text(self._tb(t)): v for t, v in zip(e.top_ids, e.top_logprobs, strict=True)}
                if self._top
                else None
            )
        return CompletionLogprobs(
            tokens=tokens, token_logprobs=values, top_logprobs=tops, text_offset=offsets
        )
