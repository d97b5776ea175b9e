"""Hermes-style calls (Qwen2.5, Qwen3 and many fine-tunes)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"tz": "CET"}}
    </tool_call>

``<tool_call>`` and ``</tool_call>`` are single special tokens.

`SYNTAX` is the one description. Constraint: each call is ``<tool_call>`` ``\\n``
one JSON object ``\\n`` ``</tool_call>``, calls separated by ``\\n``; the object is a
`marked_calls.CallObject`: ONE JSON schema over all offered tools, name first, no
other keys. Parser (`marked_calls.MarkedCallParser`): ``"name"`` must come before
``"arguments"`` (or ``"parameters"``); whitespace is free between JSON tokens and
around the markers; a call counts once its arguments object is complete, so its
``}`` and ``</tool_call>`` may be missing; an object with an unknown name, or
arguments cut short by a marker or the end, is content.
"""

from __future__ import annotations

from .call_objects import JSON_NAME_SYNTAX, json_name_ok
from .marked_calls import CallObject, CallSyntax, JsonArgumentsFormat

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"
SYNTAX = CallSyntax(
    call_begin=CALL_BEGIN,
    call_end=CALL_END,
    header=CallObject(args_key="arguments", lead="\n"),
    tail=("\n",),
    separator="\n",
)


class HermesToolFormat(JsonArgumentsFormat):
    special_markers = (CALL_BEGIN, CALL_END)
    syntax = SYNTAX
    #: a substring of both markers, shorter and so cheaper to compile than they are
    marker_covers = ("_call>",)
    name_ok = staticmethod(json_name_ok)
    name_syntax = JSON_NAME_SYNTAX
