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
"""

from __future__ import annotations

from .marked_calls import CallSyntax, Template
from .xml_params import ParamSyntax, XmlArgumentsFormat, XmlParamsParser

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
PARAMS = ParamSyntax(key_begin='<parameter name="', key_end='">', value_end="</parameter>")


class MiniMaxM2Parser(XmlParamsParser):
    syntax = SYNTAX
    params = PARAMS


class MiniMaxM2ToolFormat(XmlArgumentsFormat):
    special_markers = (SECTION_BEGIN, SECTION_END)
    syntax = SYNTAX
    params = PARAMS
    parser_class = MiniMaxM2Parser
    key_forbidden = '"<>\n'
    #: a substring of both section markers
    nested_covers = ("_call>",)
