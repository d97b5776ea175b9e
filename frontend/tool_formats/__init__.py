"""Tool-call formats: one file per family, each the single source of its syntax."""

from .base import (
    FunctionTool,
    Markup,
    ParsedCall,
    ParsedOutput,
    StreamDelta,
    ToolCallDelta,
    ToolCallParser,
    ToolFormat,
    ToolFormatError,
    collect,
    default_call_id,
)
from .json_schema import JsonSchemaToolFormat
from .registry import (
    TOOL_FORMATS,
    create_tool_format,
    get_tool_format_class,
    register_tool_format,
    tool_format_names,
)

__all__ = [
    "TOOL_FORMATS",
    "FunctionTool",
    "JsonSchemaToolFormat",
    "Markup",
    "ParsedCall",
    "ParsedOutput",
    "StreamDelta",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolFormat",
    "ToolFormatError",
    "collect",
    "create_tool_format",
    "default_call_id",
    "get_tool_format_class",
    "register_tool_format",
    "tool_format_names",
]
