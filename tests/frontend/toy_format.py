"""A small hermes-like tool format, loaded as a ``--tool-parser-plugin``.

It registers ``toy_calls``: calls written as ``<call>{"name": ..., "arguments": ...}</call>``
in plain text (no special tokens), forced with an xgrammar structural tag. It is here
to show that a plugin's format is found by name and used end to end; the family
formats live in ``frontend/tool_formats``.
"""

from __future__ import annotations

import json

from frontend.tool_formats import (
    StreamDelta,
    ToolCallDelta,
    ToolCallParser,
    ToolFormat,
    register_tool_format,
)
from structured_output import GrammarSpec, SpecKind

OPEN, CLOSE = "<call>", "</call>"


class _Parser(ToolCallParser):
    def __init__(self, fmt, tools, forced):
        super().__init__(fmt, tools, forced=forced)  # it holds each call whole all the same
        self._buf = ""
        self._in_call = False
        self._scan = 0
        self._index = 0

    def push(self, text: str) -> StreamDelta:
        self._buf += text
        out = StreamDelta()
        while True:
            if self._in_call:
                # A close marker may sit inside a JSON string: the call ends at the first
                # one after which the body parses.
                end = self._buf.find(CLOSE, self._scan)
                while end >= 0 and not self._emit(self._buf[:end], out):
                    end = self._buf.find(CLOSE, end + 1)
                if end < 0:
                    self._scan = max(0, len(self._buf) - len(CLOSE) + 1)
                    return out
                self._buf = self._buf[end + len(CLOSE) :]
                self._in_call = False
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                out.content += self._buf[:start]
                self._buf = self._buf[start + len(OPEN) :]
                self._in_call, self._scan = True, 0
                continue
            keep = next((k for k in range(len(OPEN) - 1, 0, -1) if self._buf.endswith(OPEN[:k])), 0)
            out.content += self._buf[: len(self._buf) - keep]
            self._buf = self._buf[len(self._buf) - keep :]
            return out

    def _emit(self, body: str, out: StreamDelta) -> bool:
        try:
            obj = json.loads(body)
        except ValueError:
            return False
        name = obj["name"]
        out.tool_calls.append(
            ToolCallDelta(
                self._index,
                self.new_call_id(self._index, name),
                name,
                json.dumps(obj.get("arguments", {})),
            )
        )
        self._index += 1
        return True

    def finish(self) -> StreamDelta:
        out = StreamDelta(content=(OPEN if self._in_call else "") + self._buf)
        self._buf = ""
        return out


@register_tool_format("toy_calls")
class ToyCallsFormat(ToolFormat):
    def constraint(self, tools, *, named, parallel):
        tags = [
            {
                "type": "tag",
                "begin": OPEN + json.dumps({"name": t.name})[:-1] + ', "arguments": ',
                "content": {"type": "json_schema", "json_schema": t.schema},
                "end": "}" + CLOSE,
            }
            for t in tools
            if named is None or t.name == named
        ]
        fmt = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": named is not None or not parallel,
        }
        return GrammarSpec(
            SpecKind.STRUCTURAL_TAG, json.dumps({"type": "structural_tag", "format": fmt})
        )

    def new_parser(self, tools, *, named=None, forced=False):
        return _Parser(self, tools, forced)
