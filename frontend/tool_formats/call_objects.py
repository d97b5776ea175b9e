"""Calls written as JSON objects, ``{"name": "get_weather", "arguments": {...}}``, one
after another with a separator (llama3_json's ``;``, an array's ``,``): the schema
that constrains them and the parser states that read them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import FunctionTool
from .json_text import Incomplete, NoMatch, read_call_header
from .scanning import Markers, ScanParser
from .schemas import embed

#: the keys a call object's arguments may have
ARGUMENT_KEYS = ("arguments", "parameters")


def call_object_schema(tools: Sequence[FunctionTool], args_key: str) -> dict[str, Any]:
    """``{"name": NAME, args_key: PARAMETERS}`` for any one of ``tools``, as one schema:
    name first, no other keys (each tool's definitions moved to the top, so its
    references still resolve)."""
    alternatives = []
    defs: dict[str, Any] = {}
    for i, t in enumerate(tools):
        params, tool_defs = embed(t.schema, f"t{i}.")
        defs.update(tool_defs)
        alternatives.append(
            {
                "type": "object",
                "properties": {"name": {"enum": [t.name]}, args_key: params},
                "required": ["name", args_key],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


def read_object_header(text: str, i: int) -> tuple[int, str]:
    """A call object's header (`json_text.read_call_header` with `ARGUMENT_KEYS`)."""
    return read_call_header(text, i, ARGUMENT_KEYS)


def json_name_ok(name: str) -> bool:
    """A name a JSON string carries: printable, without markup brackets."""
    return bool(name) and name.isprintable() and not any(c in name for c in "<>[]")


JSON_NAME_SYNTAX = "printable, without '<', '>', '[' or ']'"


class CallObjectsParser(ScanParser):
    """States that read call objects: ``OBJECT (SEPARATOR OBJECT)* [CLOSER]``.

    An object must start ``{"name": ...`` and then its arguments key. When an object
    does not (or a separator or closer is missing), reading of objects stops there
    and the rest goes to the state given to `_read_objects`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._separator = ""
        self._closer: str | None = None
        self._objects_cut = Markers(())
        self._after_objects: Callable[[], bool] = self._start

    def _read_objects(
        self, *, separator: str, closer: str | None, cut: Markers, then: Callable[[], bool]
    ) -> None:
        self._separator = separator
        self._closer = closer
        self._objects_cut = cut
        self._after_objects = then
        self._state = self._object

    def _object(self) -> bool:
        try:
            end, name = self._header_at(read_object_header, self._pos)
        except Incomplete:
            return False
        except NoMatch:
            self._state = self._after_objects
            return True
        self._pos += end
        self._open_call(name)
        self._state = self._object_arguments
        return True

    def _object_arguments(self) -> bool:
        pos = self._pos
        ended = self._stream_json(self._objects_cut)
        if ended is None:
            return self._pos != pos
        self._state = self._object_close if ended else self._objects_end
        return True

    def _object_close(self) -> bool:
        return self._expect("}", self._object_next, self._objects_end)

    def _object_next(self) -> bool:
        if self._open:
            self._close_call()
        if self._closer is not None:
            start = self._pos
            self._skip_ws()
            if self._buf.startswith(self._closer, self._pos):
                self._pos += len(self._closer)
                self._state = self._after_objects
                return True
            self._pos = start
        return self._expect(self._separator, self._object, self._objects_end)

    def _objects_end(self) -> bool:
        if self._open:
            self._close_call()
        self._state = self._after_objects
        return True

    def _expect(
        self, literal: str, then: Callable[[], bool], otherwise: Callable[[], bool]
    ) -> bool:
        """``literal`` after optional whitespace: go to ``then``; anything else (or the
        end of the output): go to ``otherwise`` with the text left unread."""
        start = self._pos
        self._skip_ws()
        buf, pos = self._buf, self._pos
        if buf.startswith(literal, pos):
            self._pos = pos + len(literal)
            self._state = then
            return True
        if not self._final and literal.startswith(buf[pos:]):
            return pos != start
        self._pos = start
        self._state = otherwise
        return True
