"""Qwen3-Coder calls (also known as qwen3_xml)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

``<tool_call>``/``</tool_call>`` are special tokens; the rest is text. Parameter
values are raw text read by the tool's schema (`xml_params`); the newline on each
side of a value belongs to the markup, so exactly one is stripped on each side.

`SYNTAX` and `PARAMS` are the one description. Constraint: calls separated by
``\\n``; in each, the tool's parameters in schema order, required ones always, each
value in the form `xml_params.value_kind` gives (raw text keeps out every place a
value may end, `xml_params.value_stops`).

Parser: whitespace between tags is free. It recovers ``<function=NAME`` without its
``>`` when the line breaks after the name, ``<parameter=KEY`` without its ``>`` (the
key ends at the line break or ``<``), a value without ``</parameter>`` (it ends at
the next ``<parameter=``, at ``</function>`` or at a call marker), and a call without
``</function>`` or ``</tool_call>``. Content: a call whose name is no tool of the
request or whose header does not read, and a call the output ends inside a value
of (a truncated call), markers included.
"""

from __future__ import annotations

from .marked_calls import CallSyntax, Template
from .xml_params import ParamSyntax, XmlArgumentsFormat

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"
SYNTAX = CallSyntax(
    call_begin=CALL_BEGIN,
    call_end=CALL_END,
    header=Template("\n<function={name}>\n"),
    tail=("</function>\n",),
    separator="\n",
)
PARAMS = ParamSyntax(
    key_begin="<parameter=", key_end=">", value_end="</parameter>", newline_wrapped=True
)


class Qwen3CoderToolFormat(XmlArgumentsFormat):
    special_markers = (CALL_BEGIN, CALL_END)
    syntax = SYNTAX
    params = PARAMS
    #: a substring of both call markers
    nested_covers = ("_call>",)
