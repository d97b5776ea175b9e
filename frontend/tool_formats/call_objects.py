"""Calls written as JSON objects, ``{"name": "get_weather", "arguments": {...}}``: the
schema that constrains one, and `CallList`, calls as such objects one after another
(llama3_json's ``;``-separated calls, the JSON-schema way's array), whose
description both the constraint and the parser read."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .base import FunctionTool
from .grammar import Format, FreeText, const, json_value, repeated, seq
from .json_text import Incomplete, NoMatch, read_call_header
from .scanning import MarkerSet, ScanParser
from .schemas import embed

#: the keys a call object's arguments may have
ARGUMENT_KEYS = ("arguments", "parameters")
#: the fixed texts of a call object
CALL_OBJECT_MARKUP = ("{", '"name"', ":", ",", *(f'"{k}"' for k in ARGUMENT_KEYS), "}")


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


def call_header(name: str, args_key: str) -> str:
    """A call object's header as chat templates write it, ``{"name": NAME, "KEY": ``
    (JSON with ``": "`` and ``", "``; the name escaped only where JSON must)."""
    return f'{{"name": {json.dumps(name, ensure_ascii=False)}, "{args_key}": '


def call_object(tools: Sequence[FunctionTool], args_key: str, free: FreeText) -> Format:
    """One call object of any of ``tools``: `call_object_schema`; for one tool (a
    named call), its header as forced text (`call_header`), its arguments and ``}``,
    which jump forward appends whole where the schema would leave the header's
    whitespace to the model."""
    if len(tools) == 1:
        (tool,) = tools
        header = const(call_header(tool.name, args_key))
        return seq(header, json_value(tool.schema, free), const("}"))
    return json_value(call_object_schema(tools, args_key), free)


def read_object_header(text: str, i: int) -> tuple[int, str]:
    """A call object's header (`json_text.read_call_header` with `ARGUMENT_KEYS`)."""
    return read_call_header(text, i, ARGUMENT_KEYS)


def json_name_ok(name: str) -> bool:
    """A name a JSON string carries: printable, without markup brackets."""
    return bool(name) and name.isprintable() and not any(c in name for c in "<>[]")


JSON_NAME_SYNTAX = "printable, without '<', '>', '[' or ']'"


@dataclass(frozen=True)
class CallList:
    """Call objects in a row: ``opening OBJECT (separator OBJECT)* closing``.

    The constraint writes exactly this (the objects as `call_object` with
    ``args_key``: ONE schema over all offered tools); the parser reads the separator
    and the closing with any whitespace around them, either arguments key, and, with
    ``bare_separator``, objects separated by whitespace alone (a model writing one
    call per line)."""

    #: the arguments key the constraint writes
    args_key: str
    #: what the constraint writes between two objects
    separator: str
    opening: str = ""
    closing: str = ""
    bare_separator: bool = False

    @property
    def markup(self) -> tuple[str, ...]:
        texts = (self.opening, *CALL_OBJECT_MARKUP, self.separator.strip(), self.closing)
        return tuple(dict.fromkeys(t for t in texts if t))

    def grammar(self, tools: Sequence[FunctionTool], free: FreeText, *, many: bool) -> Format:
        """One object (or, with ``many``, one or more) of any of ``tools``."""
        call = call_object(tools, self.args_key, free)
        calls = repeated(call, separator=const(self.separator), parallel=many)
        return seq(const(self.opening), calls, const(self.closing))


class CallObjectsParser(ScanParser):
    """States that read a `CallList`.

    An object must start ``{"name": ...`` and then its arguments key. The first
    object that is not a call (or a missing separator) ends the list there, and the
    rest goes to the state given to `_read_objects`; an object whose name is no tool
    of the request, or whose arguments are cut short or not a JSON object, is content
    (from the list's opening, for the first object)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._list = CallList("arguments", ",")
        self._objects_cut = MarkerSet(())
        self._after_objects: Callable[[], bool] = self._start

    def _objects_ahead(self, listing: CallList, i: int) -> int | None:
        """Whether the text at ``i`` (after whitespace) opens ``listing`` with a call
        object's header: the index past the opening, or None if it does not. Raises
        `Incomplete` while that cannot be told."""
        buf = self._buf
        while i < len(buf) and buf[i].isspace():
            i += 1
        opening = listing.opening
        if not buf.startswith(opening, i):
            if opening.startswith(buf[i:]) and not self._final:
                raise Incomplete
            return None
        at = i + len(opening)
        try:
            self._header_at(read_object_header, at)
        except NoMatch:
            return None
        return at

    def _read_objects(
        self,
        listing: CallList,
        *,
        start: int,
        at: int,
        cut: MarkerSet,
        then: Callable[[], bool],
    ) -> None:
        """Read ``listing``'s objects from ``at`` (past its opening). The list's text
        begins at ``start``: if its first object is not a call, that text is content
        (a call already held keeps its own start)."""
        self._begin_call(start)
        self._pos = at
        self._list = listing
        self._objects_cut = cut
        self._after_objects = then
        self._state = self._object

    def _object(self) -> bool:
        try:
            end, name = self._header_at(read_object_header, self._pos)
        except Incomplete:
            return False
        except NoMatch:
            return self._objects_end()
        self._begin_call(self._pos)
        if not self._name_call(name):
            return self._objects_end()
        self._pos += end
        self._state = self._object_arguments
        return True

    def _object_arguments(self) -> bool:
        pos = self._pos
        ended = self._read_json(self._objects_cut)
        if ended is None:
            return self._pos != pos
        if ended and self._end_call():
            self._state = self._object_close
            return True
        return self._objects_end()

    def _object_close(self) -> bool:
        return self._expect("}", self._object_next, self._after_objects)

    def _object_next(self) -> bool:
        listing = self._list
        start = self._pos
        self._skip_ws()
        buf, pos = self._buf, self._pos
        for literal, then in (
            (listing.closing, self._after_objects),
            (listing.separator.strip(), self._object),
        ):
            if not literal:
                continue
            if buf.startswith(literal, pos):
                self._pos = pos + len(literal)
                self._state = then
                return True
            if not self._final and literal.startswith(buf[pos : pos + len(literal)]):
                return pos != start
        if listing.bare_separator and buf.startswith("{", pos):
            self._state = self._object
            return True
        self._pos = start
        self._state = self._after_objects
        return True

    def _objects_end(self) -> bool:
        """No more calls: a call being read is content, and so is what follows."""
        if self._call is not None:
            self._fail_call()
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
