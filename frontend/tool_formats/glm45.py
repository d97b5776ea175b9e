"""GLM-4.5 calls; every marker is a special token::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.7 writes the same without the newlines, which the parser reads too (the name
ends at whitespace or ``<``). Values are raw text read by the tool's schema
(`xml_params`), verbatim. Calls are separated by ``\\n`` in the constraint.
"""

from __future__ import annotations

from .json_text import Incomplete, NoMatch
from .marked_calls import CallSyntax, Template
from .xml_params import ParamSyntax, XmlArgumentsFormat, XmlParamsParser

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
    key_begin=KEY_BEGIN, key_end=KEY_END, gap="\n", value_begin=VALUE_BEGIN, value_end=VALUE_END
)
_NAME_END = ("<", " ", "\t", "\r", "\n")


class Glm45Parser(XmlParamsParser):
    syntax = SYNTAX
    params = PARAMS

    def read_header(self, text: str, i: int) -> tuple[int, str, str | None]:
        while i < len(text) and text[i].isspace():
            i += 1
        ends = [j for c in _NAME_END if (j := text.find(c, i)) >= 0]
        if not ends:
            raise Incomplete
        j = min(ends)
        if j == i:
            raise NoMatch
        return j, text[i:j], None


class Glm45ToolFormat(XmlArgumentsFormat):
    special_markers = (CALL_BEGIN, CALL_END, KEY_BEGIN, KEY_END, VALUE_BEGIN, VALUE_END)
    syntax = SYNTAX
    params = PARAMS
    parser_class = Glm45Parser
    key_forbidden = "<\n"
    nested_covers = ("_call>",)
