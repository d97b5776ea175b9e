"""OpenAI Harmony (gpt-oss): messages on channels. A call is a commentary message to
``functions.NAME`` whose body is the JSON arguments; ``<|call|>`` ends it and the
turn::

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

The answer is a final-channel message, ``<|channel|>final<|message|>TEXT<|return|>``.
Any message may open with ``<|start|>assistant``.

Constraint: exactly one call (``<|call|>`` ends the turn, so there is one call per
generation), optionally opened with ``<|start|>assistant``; the grammar ends right
before ``<|call|>``, a stop token the engine stops on. `response_constraint` puts a
response format inside a final-channel message the same way.

Parser: a message's header (between ``<|start|>``/``<|channel|>`` and
``<|message|>``) names its channel and recipient, in either order. A message to
``functions.NAME`` is a call, its body the arguments (leading whitespace dropped);
a final or commentary message's body is content; an analysis message (reasoning,
normally removed before this parser) is dropped, as is any header that never
reaches ``<|message|>``. Text outside messages is content.
"""  # noqa: E501

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from structured_output import GrammarSpec, SpecKind

from .base import FunctionTool, ToolCallParser, ToolFormat
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
from .scanning import Markers, ScanParser

START = "<|start|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
MESSAGE = "<|message|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"
ROLE = "assistant"
FUNCTIONS = "functions."
#: the longest header the parser waits for before it drops it
_MAX_HEADER = 1024
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_CHANNEL_NAME = re.compile(r"^\s*(\w+)")


def _opening() -> Format:
    """What a message may begin with."""
    return seq(optional(seq(token(START), const(ROLE))), token(CHANNEL))


class HarmonyToolFormat(ToolFormat):
    special_markers = (START, CHANNEL, CONSTRAIN, MESSAGE, END, CALL, RETURN)
    frames_answers = True

    def constraint(
        self, tools: Sequence[FunctionTool], *, named: str | None, parallel: bool
    ) -> GrammarSpec:
        chosen = select_tools(self.name, tools, named, api_name_ok, API_NAME_SYNTAX)
        free = FreeText.build(self.tokenizer, self.special_markers, ["<|"])
        calls = [
            seq(
                const(f"commentary to={FUNCTIONS}{t.name} "),
                token(CONSTRAIN),
                const("json"),
                token(MESSAGE),
                json_value(t.schema, free),
            )
            for t in chosen
        ]
        return structural_tag(seq(_opening(), alt(calls)))

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
        return structural_tag(seq(_opening(), const("final"), token(MESSAGE), body))

    def new_parser(
        self, tools: Sequence[FunctionTool], *, named: str | None = None
    ) -> ToolCallParser:
        return HarmonyParser(self, tools, named=named)


class HarmonyParser(ScanParser):
    _opening = Markers([START, CHANNEL])
    _header_end = Markers([MESSAGE, START, END, CALL, RETURN])
    _body_end = Markers([END, CALL, RETURN, START, CHANNEL])

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._opened_with = ""
        self._body_kind = ""
        self._lead = False

    def _start(self) -> bool:
        self._state = self._outside
        return True

    def _outside(self) -> bool:
        pos = self._pos
        text, marker = self._until(self._opening)
        self._content(text)
        if marker is not None:
            self._opened_with = marker
            self._state = self._header
        return self._pos != pos

    def _header(self) -> bool:
        """Everything up to ``<|message|>``. A header that another marker or the end
        of the output cuts short is dropped; one longer than `_MAX_HEADER` is read
        as content."""
        buf, pos = self._buf, self._pos
        m = self._header_end.search(buf, pos)
        reach = m.start() if m is not None else self._header_end.safe_end(buf, pos)
        if reach - pos > _MAX_HEADER:
            self._content(self._opened_with)
            self._state = self._outside
            return True
        if m is None:
            if not self._final:
                return False
            self._pos = len(buf)
        elif m.group() != MESSAGE:
            self._pos = m.start()
        else:
            header = buf[pos : m.start()]
            if self._opened_with == CHANNEL:
                header = CHANNEL + header
            self._pos = m.end()
            self._begin_body(header)
            return True
        self._state = self._outside
        return True

    def _begin_body(self, header: str) -> None:
        recipient = _RECIPIENT.search(header)
        to = recipient.group(1) if recipient is not None else ""
        if to.startswith(FUNCTIONS) and len(to) > len(FUNCTIONS):
            self._open_call(to[len(FUNCTIONS) :])
            self._lead = True
            self._state = self._call_body
            return
        channel = _CHANNEL_NAME.match(header.partition(CHANNEL)[2])
        analysis = channel is not None and channel.group(1) == "analysis"
        self._body_kind = "drop" if analysis else "content"
        self._state = self._body

    def _call_body(self) -> bool:
        start = self._pos
        if self._lead:
            self._skip_ws()
            if self._pos == len(self._buf) and not self._final:
                return self._pos != start
            self._lead = False
        text, marker = self._until(self._body_end)
        self._args(text)
        return self._end_body(marker, start)

    def _body(self) -> bool:
        start = self._pos
        text, marker = self._until(self._body_end)
        if self._body_kind == "content":
            self._content(text)
        return self._end_body(marker, start)

    def _end_body(self, marker: str | None, start: int) -> bool:
        if marker is None:
            if not self._final:
                return self._pos != start
        elif marker in (START, CHANNEL):
            self._pos -= len(marker)  # the next message begins
        if self._open:
            self._close_call()
        self._state = self._outside
        return True
