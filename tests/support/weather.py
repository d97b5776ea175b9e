"""The two tools the front-end and HTTP tests call (the weather, the time), their
schemas, and a hermes call as a scripted model writes it."""

from __future__ import annotations

import json

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"tz": {"type": "string", "maxLength": 30}},
    "required": ["tz"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
#: tool name -> its parameters' schema
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def call(name: str, arguments: dict) -> str:
    """One call as the model writes it in hermes' syntax."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
