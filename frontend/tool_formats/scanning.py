"""The incremental machine under every parser: a buffer of unread text, a state
method that consumes what it can be sure of, marker search with a held-back tail,
and the emission of content and calls in the OpenAI stream form.

Why stream and whole parse agree: a state consumes text only when no later text can
change how that text is read (a partial marker at the end of the buffer is held
back; a state that cannot decide yet waits), so every emission is a function of the
text alone, however it was cut into pieces. `ToolFormat.parse` runs this same
machine on the whole text at once.

Why every call that comes out is a call (auto mode): a call is held from its first
character until it resolves. It resolves as a call once its name is one of the
request's tools and its arguments are complete and one JSON object; it then comes
out whole (id, name and arguments in one piece). Anything else (an unknown name,
arguments cut short by a marker or by the end of the output, arguments that are not
an object) was not a call: its text, markers included, is released as content, and
reading goes on after it. What is held is the call's own text, kept as the pieces it
was consumed in, so no push rescans it.

Forced mode (the parser's ``forced``: the format's constraint wrote the output, so
its calls are calls by construction): a call is a call once its name is one of the
request's tools. Its first piece (index, id, name) comes out then, and each
arguments text a state reads comes out as it is read, surrounding whitespace left
out (held at the end of what came so far until more text shows it is inside). What
stops it early (the end of the output, a marker, text that does not read) ends the
call where it stands: arguments cut short stay as they came (``finish_reason``
"length" says so), and nothing of a call's text is released as content. Stream and
whole agree the same way as in auto mode: each piece is a function of the text alone.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from .base import FunctionTool, StreamDelta, ToolCallDelta, ToolCallParser
from .json_text import Incomplete, JsonExtent, NoMatch, is_json_object

if TYPE_CHECKING:
    from .base import ToolFormat


#: the most text a call's header may take: a header still undecided after this many
#: characters is not a header (so a parser never holds back more than this)
MAX_HEADER = 1024
T = TypeVar("T")


class MarkerSet:
    """A fixed set of marker texts: where the first one occurs, and how much of a
    buffer's end could still be the start of one."""

    __slots__ = ("texts", "_re", "_prefixes", "_longest")

    def __init__(self, texts: Iterable[str], *, hold_complete: bool = False) -> None:
        self.texts = tuple(sorted(set(texts), key=len, reverse=True))
        if not all(self.texts):
            raise ValueError("markers must be non-empty texts")
        self._re = re.compile("|".join(map(re.escape, self.texts)) if self.texts else "(?!)")
        # With hold_complete, a whole marker at the end is held back too (a stop
        # text is only dropped when nothing follows it).
        extra = 1 if hold_complete else 0
        self._prefixes = {m[:k] for m in self.texts for k in range(1, len(m) + extra)}
        self._longest = max(map(len, self.texts), default=1) - 1 + extra

    def search(self, text: str, pos: int) -> re.Match[str] | None:
        """The first marker at or after ``pos`` (the longest one where several start)."""
        return self._re.search(text, pos)

    def safe_end(self, text: str, pos: int) -> int:
        """The index from which ``text`` (read from ``pos``) may still turn into a
        marker once more text arrives; ``len(text)`` when no marker can start there."""
        n = len(text)
        for k in range(min(self._longest, n - pos), 0, -1):
            if text[n - k :] in self._prefixes:
                return n - k
        return n

    def may_start(self, text: str, pos: int) -> bool:
        """Whether ``text[pos:]`` is a proper prefix of a marker (could become one)."""
        rest = text[pos:]
        return any(m.startswith(rest) and m != rest for m in self.texts)


@dataclass(slots=True)
class _HeldCall:
    """A call being read, not yet resolved."""

    #: its text consumed before the buffer's current start, in pieces
    raw: list[str]
    #: where the rest of its text begins in the buffer
    start: int
    name: str = ""
    call_id: str | None = None
    arguments: list[str] = field(default_factory=list)
    #: forced mode: its index once it streams (its first piece came out)
    index: int | None = None
    #: forced mode: arguments text has come out (leading whitespace is left out)
    begun: bool = False
    #: forced mode: whitespace at the end of what was read, not yet known to be inside
    trailing: list[str] = field(default_factory=list)


class ScanParser(ToolCallParser):
    """A `ToolCallParser` driven by a state method.

    A family sets ``self._state`` to a method that reads ``self._buf`` from
    ``self._pos``, consumes what is certain, and returns True when it made progress
    (consumed text or changed state) or False when it needs more text. Once
    ``self._final`` is set the output is complete and every state must resolve what
    it holds. Whitespace that only separates content from calls is not content; a
    stop-token text at the very end of the output is dropped.

    A state reads a call with `_begin_call` (where its text starts), `_name_call`,
    `_args`, and then `_end_call` (the call is complete: emit it if it is valid) or
    `_fail_call` (it is not a call: its text is content). In forced mode the same
    calls stream the call instead (see the module docstring).
    """

    def __init__(
        self,
        fmt: ToolFormat,
        tools: Sequence[FunctionTool],
        *,
        named: str | None = None,
        forced: bool = False,
    ) -> None:
        super().__init__(fmt, tools, named=named, forced=forced)
        self._buf = ""
        self._pos = 0
        self._final = False
        self._out = StreamDelta()
        self._calls = 0
        self._call: _HeldCall | None = None
        self._ws = ""
        self._content_started = False
        stops = [t for i in fmt.tokenizer.stop_token_ids if (t := fmt.tokenizer.decode([i]))]
        self._stops = MarkerSet(stops, hold_complete=True) if stops else None
        self._stop_texts = frozenset(stops)
        self._held = ""
        self._json = JsonExtent()
        self._state: Callable[[], bool] = self._start

    # ----- the ToolCallParser interface -------------------------------------

    def push(self, text: str) -> StreamDelta:
        if text:
            data = self._held + text
            cut = self._stops.safe_end(data, 0) if self._stops else len(data)
            self._held = data[cut:]
            self._feed(data[:cut])
        return self._take()

    def finish(self) -> StreamDelta:
        self._trim()
        if self._held not in self._stop_texts:
            self._buf += self._held
        self._held = ""
        self._final = True
        self._run()
        assert self._pos == len(self._buf), "a final state left text unread"
        if self._call is not None:
            self._fail_call()  # still open at the end: incomplete
        if not self._calls:
            self._out.content += self._ws
        self._ws = ""
        return self._take()

    # ----- driving the states -----------------------------------------------

    def _feed(self, text: str) -> None:
        if text:
            self._trim()
            self._buf += text
            self._run()

    def _trim(self) -> None:
        """Drop the consumed text from the buffer (a held call keeps its share)."""
        call = self._call
        if call is not None and call.index is None:
            call.raw.append(self._buf[call.start : self._pos])
            call.start = 0
        self._buf = self._buf[self._pos :]
        self._pos = 0

    def _run(self) -> None:
        while self._state():
            pass

    @abstractmethod
    def _start(self) -> bool:
        """The first state."""

    def _rest_is_content(self) -> bool:
        """A state: everything from here on is content."""
        pos = self._pos
        self._content(self._buf[pos:])
        self._pos = len(self._buf)
        return self._pos != pos

    def _take(self) -> StreamDelta:
        out, self._out = self._out, StreamDelta()
        return out

    def _until(self, markers: MarkerSet) -> tuple[str, str | None]:
        """Consume text up to the first of ``markers`` and the marker itself. Returns
        the text and the marker; without a marker, the text that cannot be part of
        one (all of it once the output is complete) and None."""
        buf, pos = self._buf, self._pos
        m = markers.search(buf, pos)
        if m is not None:
            self._pos = m.end()
            return buf[pos : m.start()], m.group()
        end = len(buf) if self._final else markers.safe_end(buf, pos)
        self._pos = end
        return buf[pos:end], None

    def _header_at(self, read: Callable[[str, int], T], at: int) -> T:
        """``read(text, 0)`` on the text from ``at``, at most `MAX_HEADER` characters
        of it (indices in the result count from ``at``). `Incomplete` only while the
        output goes on and fewer characters than that have arrived; `NoMatch` after."""
        window = self._buf[at : at + MAX_HEADER]
        try:
            return read(window, 0)
        except Incomplete:
            if self._final or len(window) >= MAX_HEADER:
                raise NoMatch from None
            raise

    def _skip_ws(self) -> None:
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i].isspace():
            i += 1
        self._pos = i

    # ----- emitting -----------------------------------------------------------

    def _content(self, text: str) -> None:
        """Content text. Whitespace is held until the next text shows where it stands:
        whitespace that only separates content from calls (at the start of content
        after a call, or at the end before a call or the end of the output) is not
        content; whitespace between two pieces of content is."""
        if not text:
            return
        pending = self._ws + text
        body = pending.rstrip()
        if not body:
            self._ws = pending
            return
        if not self._content_started and self._calls:
            body = body.lstrip()
        self._out.content += body
        self._content_started = True
        self._ws = pending[len(pending.rstrip()) :]

    # ----- calls --------------------------------------------------------------

    def _begin_call(self, at: int) -> None:
        """A call may begin at buffer index ``at`` (at most ``self._pos``): hold its
        text from there on. A call already held keeps its own start."""
        if self._call is None:
            self._call = _HeldCall(raw=[], start=at)

    def _name_call(self, name: str, call_id: str | None = None) -> bool:
        """Name the held call; False if ``name`` is not one of the request's tools
        (the call is then not a call: the caller fails it). In forced mode a named
        call is a call: its first piece comes out now."""
        call = self._call
        assert call is not None
        if name not in self.tools_by_name:
            return False
        call.name = name
        call.call_id = call_id
        if self.forced:
            call.index = index = self._calls
            self._calls += 1
            cid = call_id if call_id is not None else self.new_call_id(index, name)
            self._out.tool_calls.append(ToolCallDelta(index=index, id=cid, name=name))
        return True

    def _args(self, text: str) -> None:
        """More arguments text for the held call (in forced mode, out it goes)."""
        if not text:
            return
        call = self._call
        assert call is not None
        if call.index is None:
            call.arguments.append(text)
            return
        if not call.begun:
            text = text.lstrip()
            if not text:
                return
            call.begun = True
        body = text.rstrip()
        if not body:
            call.trailing.append(text)
            return
        if call.trailing:
            held = "".join(call.trailing)
            call.trailing.clear()
        else:
            held = ""
        if len(body) < len(text):
            call.trailing.append(text[len(body) :])
        body = held + body
        out = self._out.tool_calls
        if out and out[-1].index == call.index:
            out[-1].arguments += body
        else:
            out.append(ToolCallDelta(index=call.index, arguments=body))

    def _end_call(self) -> bool:
        """The held call is complete: emit it if it is named and its arguments are
        one JSON object (surrounding whitespace dropped), else release its text as
        content. Returns whether it was a call (always, for a forced call that
        streams: it came out already)."""
        call = self._call
        assert call is not None
        if call.index is not None:
            self._call = None
            return True
        arguments = "".join(call.arguments).strip()
        if not call.name or not is_json_object(arguments):
            self._fail_call()
            return False
        self._call = None
        index = self._calls
        self._calls += 1
        cid = call.call_id if call.call_id is not None else self.new_call_id(index, call.name)
        self._out.tool_calls.append(
            ToolCallDelta(index=index, id=cid, name=call.name, arguments=arguments)
        )
        return True

    def _fail_call(self) -> None:
        """The held call is not a call: its text up to ``self._pos`` is content. A
        forced call that streams ends where it stands instead (its text is the call's)."""
        call = self._call
        assert call is not None
        self._call = None
        if call.index is None:
            self._content("".join(call.raw) + self._buf[call.start : self._pos])

    def _drop_call(self) -> None:
        """What was held is markup, not a call and not content (Harmony's headers)."""
        self._call = None

    def _reach(self, stops: MarkerSet) -> tuple[int, re.Match[str] | None]:
        """How far text may be read before one of ``stops``: the index of the first
        marker (and the match), or of the held-back tail (and None)."""
        buf, pos = self._buf, self._pos
        m = stops.search(buf, pos)
        if m is not None:
            return m.start(), m
        return (len(buf) if self._final else stops.safe_end(buf, pos)), None

    def _read_json(self, stops: MarkerSet) -> bool | None:
        """Read the held call's JSON arguments value. Returns True once the value is
        complete, False when a marker of ``stops`` or the end of the output cut it
        short (the marker is left unread), None when more text is needed."""
        buf, pos = self._buf, self._pos
        end, m = self._reach(stops)
        start, stop = self._json.feed(buf, pos, end)
        self._args(buf[start:stop])
        self._pos = stop
        if self._json.done:
            self._json = JsonExtent()
            return True
        if m is not None or self._final:
            self._json = JsonExtent()
            return False
        return None
