"""Every registered tool-call format on a real vocabulary, loaded once per session.

Families whose vocabulary is bundled use it (Qwen3 for hermes and qwen3_coder,
Llama 3 for llama3_json, o200k_harmony for Harmony); the others get a real base
vocabulary with their markers added as special tokens (`vocab_for`).
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import pytest

from frontend.tool_formats import (
    FunctionTool,
    ToolFormat,
    create_tool_format,
    get_tool_format_class,
    tool_format_names,
)
from frontend.tool_formats.json_schema import JsonSchemaToolFormat
from tests.support.constrained_sampler import ConstrainedSampler
from tokenization import Tokenizer, load_tokenizer

# When a property fails, hypothesis imports libcst to suggest a patch; that import
# warns (a deprecation inside libcst), and with warnings as errors the warning would
# replace the failure report. Import it once here, quietly.
with warnings.catch_warnings(), contextlib.suppress(ImportError):
    warnings.simplefilter("ignore", DeprecationWarning)
    import libcst  # noqa: F401


#: the bundled vocabularies, in the order a family's tests prefer them
VOCABS = ("qwen3", "llama3", "o200k_harmony")
#: every registered family (a new one is tested as soon as it is registered)
FAMILIES = tool_format_names()


@functools.cache
def vocab_for(family: str) -> str:
    """The bundled vocabulary a family is tested on: the one that already has the most
    of its markers as special tokens (its own), ties to the first of `VOCABS`; the
    markers it lacks are added."""
    markers = get_tool_format_class(family).special_markers
    return max(VOCABS, key=lambda v: sum(m in load_tokenizer(v).special_tokens for m in markers))


@functools.cache
def tokenizer_for(family: str) -> Tokenizer:
    cls = get_tool_format_class(family)
    return load_tokenizer(vocab_for(family)).with_special_tokens(cls.special_markers)


@functools.cache
def format_for(family: str) -> ToolFormat:
    return create_tool_format(family, tokenizer_for(family))


@functools.cache
def json_schema_format(vocab: str) -> ToolFormat:
    return JsonSchemaToolFormat(load_tokenizer(vocab))


@functools.cache
def sampler_for(tokenizer: Tokenizer) -> ConstrainedSampler:
    return ConstrainedSampler(tokenizer)


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fmt(family: str) -> ToolFormat:
    return format_for(family)


WEATHER = FunctionTool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    description="Current weather in a city.",
)
TIME = FunctionTool(
    "get_time",
    {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    description="Current time in a time zone.",
)
EXAMPLE_TOOLS = [WEATHER, TIME]
