"""Stop strings: the one place that finds them.

The engine knows nothing of stop strings; the front end reads each output's tokens
through a `StopStringGate`, and when one completes it cuts the text there and leaves
the stream, which aborts the request in the engine.

The gate works on bytes, not characters: a UTF-8 string occurs in the UTF-8 bytes of
a text exactly where it occurs in the text, and a token may end inside a character.
The stop string that completes first (its last byte earliest in the output; of two
that end together, the one that starts first) is the one that counts, so the cut is
the same however the tokens arrive in pieces: whole and streamed responses agree.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence


class StopStringGate:
    """Holds back the last tokens while they may begin a stop string, and finds the
    first stop string.

    Released tokens never hold any byte of a stop string: a token is released once
    the tokens after it hold at least ``len(longest stop) - 1`` bytes, by which time a
    stop string that begins in it has completed, and been found. Work per call is
    proportional to the new bytes plus the longest stop string.
    """

    __slots__ = ("_tb", "_stops", "_keep", "_ids", "_sizes", "_held", "_buf", "hit")

    def __init__(self, stops: Sequence[str], token_bytes: Callable[[int], bytes]) -> None:
        if not stops or not all(stops):
            raise ValueError("stop strings must be non-empty")
        self._tb = token_bytes
        self._stops = [(s, s.encode("utf-8")) for s in dict.fromkeys(stops)]
        self._keep = max(len(b) for _, b in self._stops) - 1
        self._ids: deque[int] = deque()
        self._sizes: deque[int] = deque()
        self._held = 0
        #: the bytes of the held tokens
        self._buf = bytearray()
        #: the stop string found (the output ends at it), or None
        self.hit: str | None = None

    @property
    def num_held(self) -> int:
        """Tokens held back."""
        return len(self._ids)

    def push(self, ids: Sequence[int]) -> tuple[list[int], bytes]:
        """Add new ids. Returns the ids now known to precede any stop string, and, once
        a stop string completes (`hit` then names it), the bytes of the token it begins
        inside, up to it; nothing after a stop string is ever returned."""
        if self.hit is not None:
            return [], b""
        old = len(self._buf)
        for t in ids:
            b = self._tb(t)
            self._ids.append(t)
            self._sizes.append(len(b))
            self._buf += b
            self._held += len(b)
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for s, b in self._stops:
            pos = self._buf.find(b, max(0, old - len(b) + 1))
            if pos >= 0 and (best is None or (pos + len(b), pos) < best[:2]):
                best = (pos + len(b), pos, s)
        if best is not None:
            self.hit = best[2]
            return self._cut(best[1])
        out: list[int] = []
        drop = 0
        while self._ids and self._held - self._sizes[0] >= self._keep:
            n = self._sizes.popleft()
            self._held -= n
            drop += n
            out.append(self._ids.popleft())
        if drop:
            del self._buf[:drop]
        return out, b""

    def flush(self) -> list[int]:
        """The output ended without a stop string: release everything."""
        out = list(self._ids)
        self._clear()
        return out

    def _cut(self, pos: int) -> tuple[list[int], bytes]:
        """The held ids wholly before byte ``pos`` of the held bytes, and the bytes of
        the token that ``pos`` falls inside, up to ``pos``."""
        out: list[int] = []
        start = 0
        partial = b""
        for t, n in zip(self._ids, self._sizes, strict=True):
            if start + n <= pos:
                out.append(t)
                start += n
                continue
            partial = bytes(self._buf[start:pos])
            break
        self._clear()
        return out, partial

    def _clear(self) -> None:
        self._ids.clear()
        self._sizes.clear()
        self._buf.clear()
        self._held = 0
