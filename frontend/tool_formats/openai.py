"""OpenAI Harmony (gpt-oss): messages on channels. A call is a commentary message to
``functions.NAME`` whose body is the JSON arguments; ``<|call|>`` ends it and the
turn::

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

The answer is a final-channel message, ``<|channel|>final<|message|>TEXT<|return|>``.
Any message may open with ``<|start|>assistant``. `HARMONY` is the one description
(markers, role, channels, the recipient's form).

Constraint: exactly one call (``<|call|>`` ends the turn, so there is one call per
generation), optionally opened with ``<|start|>assistant``; the grammar ends right
before ``<|call|>``, a stop token the engine stops on. `response_constraint` puts a
response format inside a final-channel message the same way.

Parser: a message's header (between ``<|start|>``/``<|channel|>`` and
``<|message|>``) names its channel and recipient, in either order, with any
whitespace. A message to ``functions.NAME`` is a call, its body the arguments; it
counts when NAME is one of the request's tools and the body (up to the next marker
or the end of the output) is one JSON object, and otherwise the whole message,
header included, is content. A final or commentary message's body is content; an
analysis message (reasoning, normally removed before this parser) is dropped, as is
the header of any message that is not a call. A header that mentions
``functions.`` or one of the request's tools but is no call (``commentary get_weather
<|constrain|>json``) is a failed call: its message is content. Text outside messages
is content.
"""  # noqa: E501

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from structured_output import GrammarSpec, SpecKind

from .base import FunctionTool, Markup, ToolCallParser, ToolFormat
from .grammar import (
    API_NAME_SYNTAX,
    Format,
    FreeText,
    alt,
    api_name_ok,
    const,
    json_value,
    optional,
    regex,
    select_tools,
    seq,
    structural_tag,
    token,
)
from .scanning import MarkerSet, ScanParser

#: the longest header the parser waits for before it reads it as content
_MAX_HEADER = 1024


@dataclass(frozen=True)
class Messages:
    """Harmony's message syntax, as far as calls and answers go."""

    start: str = "<|start|>"
    channel: str = "<|channel|>"
    constrain: str = "<|constrain|>"
    message: str = "<|message|>"
    end: str = "<|end|>"
    call: str = "<|call|>"
    return_: str = "<|return|>"
    role: str = "assistant"
    call_channel: str = "commentary"
    answer_channel: str = "final"
    thinking_channel: str = "analysis"
    #: a header's recipient: ``to=functions.NAME``
    recipient: str = "to="
    functions: str = "functions."
    #: what the constraint declares after ``<|constrain|>``
    content_type: str = "json"

    @property
    def markers(self) -> tuple[str, ...]:
        return (
            self.start,
            self.channel,
            self.constrain,
            self.message,
            self.end,
            self.call,
            self.return_,
        )

    def opening(self) -> Format:
        """What a message may begin with."""
        return seq(optional(seq(token(self.start), const(self.role))), token(self.channel))

    def call_header(self, name: str) -> Format:
        """A call's header after its channel marker, up to ``<|message|>``."""
        return seq(
            const(f"{self.call_channel} {self.recipient}{self.functions}{name} "),
            token(self.constrain),
            const(self.content_type),
            token(self.message),
        )


HARMONY = Messages()


class HarmonyToolFormat(ToolFormat):
    special_markers = HARMONY.markers
    frames_answers = True

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, api_name_ok, API_NAME_SYNTAX)
        free = FreeText.build(self.tokenizer, self.special_markers, ["<|"])
        calls = [seq(HARMONY.call_header(t.name), json_value(t.schema, free)) for t in chosen]
        return structural_tag(seq(HARMONY.opening(), alt(calls)))

    def response_constraint(self, spec: GrammarSpec) -> GrammarSpec:
        """``spec`` as the body of a final-channel message."""
        free = FreeText.build(self.tokenizer, self.special_markers, ["<|"])
        if spec.kind == SpecKind.JSON_SCHEMA:
            body = json_value(json.loads(spec.value), free)
        elif spec.kind == SpecKind.JSON_OBJECT:
            body = json_value({"type": "object"}, free)
        elif spec.kind == SpecKind.REGEX:
            body = regex(spec.value)
        elif spec.kind == SpecKind.CHOICE:
            body = alt(const(c) for c in json.loads(spec.value))
        elif spec.kind == SpecKind.GRAMMAR:
            body = {"type": "grammar", "grammar": spec.value}
        else:
            tag = json.loads(spec.value)
            body = tag["format"] if tag.get("type") == "structural_tag" else tag
        answer = seq(const(HARMONY.answer_channel), token(HARMONY.message), body)
        return structural_tag(seq(HARMONY.opening(), answer))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None, forced: bool = False
    ) -> ToolCallParser:
        return HarmonyParser(self, tools, named=named, forced=forced)

    @property
    def markup(self) -> Markup:
        h = HARMONY
        words = (h.role, h.call_channel, h.recipient + h.functions, h.content_type)
        return Markup((*h.markers, *words))


class HarmonyParser(ScanParser):
    _opening = MarkerSet([HARMONY.start, HARMONY.channel])
    _header_end = MarkerSet(
        [HARMONY.message, HARMONY.start, HARMONY.end, HARMONY.call, HARMONY.return_]
    )
    _body_end = MarkerSet(
        [HARMONY.end, HARMONY.call, HARMONY.return_, HARMONY.start, HARMONY.channel]
    )
    _recipient = re.compile(rf"{re.escape(HARMONY.recipient)}\s*(\S+?)(?=\s|<\||$)")
    _channel_name = re.compile(r"^\s*(\w+)")
    _words = re.compile(r"[\s=]+|<\|[a-z]+\|>")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._opened_with = ""
        self._body_kind = ""

    def _start(self) -> bool:
        self._state = self._outside
        return True

    def _outside(self) -> bool:
        pos = self._pos
        text, marker = self._until(self._opening)
        self._content(text)
        if marker is not None:
            self._opened_with = marker
            self._begin_call(self._pos - len(marker))  # held until the header tells
            self._state = self._header
        return self._pos != pos

    def _header(self) -> bool:
        """Everything up to ``<|message|>``. A header another marker or the end of
        the output cuts short is dropped (or, if it names a function, content); one
        longer than `_MAX_HEADER` is read as content. A ``<|channel|>`` cuts it short
        too where it opens another message: in a header opened with ``<|channel|>``,
        or the second one after ``<|start|>``."""
        buf, pos = self._buf, self._pos
        m = self._header_end.search(buf, pos)
        reach = m.start() if m is not None else self._header_end.safe_end(buf, pos)
        cut = self._next_message(buf, pos, reach)
        if cut is not None:
            m, reach = None, cut
        if reach - pos > _MAX_HEADER:
            self._fail_call()
            self._state = self._outside
            return True
        if m is None and cut is None and not self._final:
            return False
        header = buf[pos:reach] if m is not None or cut is not None else buf[pos:]
        if self._opened_with == HARMONY.channel:
            header = HARMONY.channel + header
        attempt, name = self._function_of(header)
        if m is None or m.group() != HARMONY.message:
            self._pos = reach if cut is not None else len(buf) if m is None else m.start()
            if attempt:
                self._fail_call()
            else:
                self._drop_call()
            self._state = self._outside
            return True
        self._pos = m.end()
        if attempt:
            if name is not None and self._name_call(name):
                self._state = self._call_body
                return True
            self._body_kind = "failed"
        else:
            self._drop_call()
            channel = self._channel_name.match(header.partition(HARMONY.channel)[2])
            thinking = channel is not None and channel.group(1) == HARMONY.thinking_channel
            self._body_kind = "drop" if thinking else "content"
        self._state = self._body
        return True

    def _next_message(self, buf: str, pos: int, reach: int) -> int | None:
        """Where a ``<|channel|>`` in ``buf[pos:reach]`` opens another message (the
        header's own, after ``<|start|>``, does not), or None."""
        own = self._opened_with == HARMONY.start
        at = buf.find(HARMONY.channel, pos, reach)
        if own and at >= 0:
            at = buf.find(HARMONY.channel, at + len(HARMONY.channel), reach)
        return at if at >= 0 else None

    def _function_of(self, header: str) -> tuple[bool, str | None]:
        """Whether a header tries to call a function, and which: a recipient
        ``functions.NAME`` (NAME), or any mention of ``functions.`` or of one of the
        request's tools (None: a call attempt that names nothing callable)."""
        recipient = self._recipient.search(header)
        to = recipient.group(1) if recipient is not None else ""
        if to.startswith(HARMONY.functions) and len(to) > len(HARMONY.functions):
            return True, to[len(HARMONY.functions) :]
        if HARMONY.functions in header:
            return True, None
        words = self._words.split(header)
        return any(w in self.tools_by_name for w in words), None

    def _call_body(self) -> bool:
        start = self._pos
        text, marker = self._until(self._body_end)
        self._args(text)
        if marker is None and not self._final:
            return self._pos != start
        if marker in (HARMONY.start, HARMONY.channel):
            self._pos -= len(marker)  # the next message begins
        self._end_call()
        self._state = self._outside
        return True

    def _body(self) -> bool:
        start = self._pos
        text, marker = self._until(self._body_end)
        if self._body_kind == "content":
            self._content(text)
        if marker is None and not self._final:
            return self._pos != start
        if marker in (HARMONY.start, HARMONY.channel):
            self._pos -= len(marker)  # the next message begins
        if self._body_kind == "failed":
            self._fail_call()
        self._state = self._outside
        return True
