"""GLM-4.5 calls; every marker is a special token::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.7 writes the same without the newlines, which the parser reads too (the name
ends at whitespace or ``<``, `marked_calls.Template`). Values are raw text read by
the tool's schema (`xml_params`), verbatim. `SYNTAX` and `PARAMS` are the one
description; calls are separated by ``\\n`` in the constraint.

Parser: whitespace between tags is free; it recovers a missing ``</arg_key>`` or
``<arg_value>``, a value without ``</arg_value>`` (it ends at the next ``<arg_key>``
or a call marker) and a call without ``</tool_call>``. Content: a call whose name is
no tool of the request, and a call the output ends inside a value of.
"""

from __future__ import annotations

from .marked_calls import CallSyntax, Template
from .xml_params import ParamSyntax, XmlArgumentsFormat

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"
KEY_BEGIN = "<arg_key>"
KEY_END = "</arg_key>"
VALUE_BEGIN = "<arg_value>"
VALUE_END = "</arg_value>"
SYNTAX = CallSyntax(
    call_begin=CALL_BEGIN, call_end=CALL_END, header=Template("{name}\n"), separator="\n"
)
PARAMS = ParamSyntax(
    key_begin=KEY_BEGIN,
    key_end=KEY_END,
    gap="\n",
    value_begin=VALUE_BEGIN,
    value_end=VALUE_END,
    key_forbidden="<\n",
)


class Glm45ToolFormat(XmlArgumentsFormat):
    special_markers = (CALL_BEGIN, CALL_END, KEY_BEGIN, KEY_END, VALUE_BEGIN, VALUE_END)
    syntax = SYNTAX
    params = PARAMS
    nested_covers = ("_call>",)
