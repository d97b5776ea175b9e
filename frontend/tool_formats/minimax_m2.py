"""MiniMax-M2 calls: one section of ``<invoke>`` elements::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    <invoke name="get_time">
    <parameter name="tz">CET</parameter>
    </invoke>
    </minimax:tool_call>

The section markers are special tokens; ``<invoke ...>`` and ``<parameter ...>`` are
text. Values are raw text read by the tool's schema (`xml_params`), verbatim.
`SYNTAX` and `PARAMS` are the one description.

Parser: whitespace between the elements and around the section markers is free
(section markers are never content); it recovers a parameter name without ``">``
(it ends at ``"``, ``<`` or a line break), a value without ``</parameter>`` (it ends
at the next ``<parameter name="``, ``</invoke>`` or a section marker) and an invoke
without ``</invoke>``. Content: an invoke whose name is no tool of the request, and
one the output ends inside a value of.
"""

from __future__ import annotations

from .marked_calls import CallSyntax, Template
from .xml_params import ParamSyntax, XmlArgumentsFormat

SECTION_BEGIN = "<minimax:tool_call>"
SECTION_END = "</minimax:tool_call>"
SYNTAX = CallSyntax(
    call_begin='<invoke name="',
    call_end="</invoke>",
    header=Template('{name}">\n'),
    section=(SECTION_BEGIN + "\n", "\n" + SECTION_END),
    tail=(),
    separator="\n",
)
PARAMS = ParamSyntax(
    key_begin='<parameter name="', key_end='">', value_end="</parameter>", key_forbidden='"<>\n'
)


class MiniMaxM2ToolFormat(XmlArgumentsFormat):
    special_markers = (SECTION_BEGIN, SECTION_END)
    syntax = SYNTAX
    params = PARAMS
    #: a substring of both section markers
    nested_covers = ("_call>",)
