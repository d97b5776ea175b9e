"""A wrapper some families write around the answer (ERNIE's ``<response>``...
``</response>``, Hunyuan's ``<answer>``...``</answer>``), removed from content.

The rule, on the whole answer text ``a`` (``P`` is the pad byte, a newline):

1. with ``strip_leading_pad``, a run of ``P`` at the start of ``a`` is dropped;
2. if ``a`` then starts with ``open``: ``open`` and the run of ``P`` after it are
   dropped, and so are the first ``close`` after it, the run of ``P`` right before
   that ``close`` and the run right after it; text after the wrapper is kept;
3. an answer that does not start with ``open`` is kept as it is.

The stream form holds back only what is unresolved: a partial ``open`` at the start,
a partial ``close`` and the run of ``P`` before it (as a count). States are immutable
tuples, so a tracker's snapshot can hold them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# (mode, held bytes, run of pad bytes held before them)
WrapperState = tuple[Literal["lead", "opened", "body", "closed", "plain"], bytes, int]


@dataclass(frozen=True)
class AnswerWrapper:
    open: bytes
    close: bytes
    pad: bytes = b"\n"
    strip_leading_pad: bool = False

    def __post_init__(self) -> None:
        if len(self.pad) != 1 or not self.open or not self.close or self.close[0] == self.pad[0]:
            raise ValueError(
                "an answer wrapper needs one pad byte and tags that do not start with it"
            )

    def initial(self) -> WrapperState:
        return ("lead", b"", 0)

    def feed(self, state: WrapperState, data: bytes) -> tuple[bytes, WrapperState]:
        """Content bytes out for ``data`` in, and the next state. Work is proportional to
        ``len(data)`` plus the held bytes (shorter than the tags)."""
        mode, held, run = state
        pad = self.pad
        if mode == "plain":
            return data, state
        if mode == "lead":
            if self.strip_leading_pad and not held:
                data = data.lstrip(pad)
            buf = held + data
            if buf.startswith(self.open):
                return self.feed(("opened", b"", 0), buf[len(self.open) :])
            if self.open.startswith(buf):
                return b"", ("lead", buf, 0)
            return buf, ("plain", b"", 0)
        if mode in ("opened", "closed"):
            data = data.lstrip(pad)
            if not data:
                return b"", state
            if mode == "closed":
                return data, ("plain", b"", 0)
            mode = "body"
        # body: a run of pad bytes (counted) and a partial close tag may be held.
        if not held:
            stripped = data.lstrip(pad)
            run += len(data) - len(stripped)
            data = stripped
            if not data:
                return b"", ("body", b"", run)
        buf = held + data
        i = buf.find(self.close)
        if i >= 0:
            before = buf[:i]
            out = pad * run + before.rstrip(pad) if before else b""
            rest, state = self.feed(("closed", b"", 0), buf[i + len(self.close) :])
            return out + rest, state
        k = _partial_len(buf, self.close)
        body = buf[: len(buf) - k]
        stripped = body.rstrip(pad)
        out = b""
        if stripped:
            out = pad * run + stripped
            run = 0
        run += len(body) - len(stripped)
        return out, ("body", buf[len(buf) - k :], run)

    def flush(self, state: WrapperState) -> bytes:
        """What is still held when the output ends (content, unless it is pad that
        followed a tag)."""
        mode, held, run = state
        if mode == "body":
            return self.pad * run + held
        return held if mode == "lead" else b""


def _partial_len(buf: bytes, tag: bytes) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``tag``."""
    for k in range(min(len(buf), len(tag) - 1), 0, -1):
        if tag.startswith(buf[-k:]):
            return k
    return 0
