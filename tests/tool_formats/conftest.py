"""Every tool-call format on a real vocabulary, loaded once per session.

Families whose vocabulary is bundled use it (Qwen3 for hermes and qwen3_coder,
Llama 3 for llama3_json and pythonic, o200k_harmony for Harmony); the others get a
real base vocabulary with their markers added as special tokens.
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


#: family -> the vocabulary it is tested on (its own, or a base one for its markers)
FAMILY_VOCAB = {
    "hermes": "qwen3",
    "qwen3_coder": "qwen3",
    "llama3_json": "llama3",
    "pythonic": "llama3",
    "openai": "o200k_harmony",
    "deepseek_v3": "qwen3",
    "deepseek_v31": "qwen3",
    "kimi_k2": "llama3",
    "glm45": "qwen3",
    "minimax_m2": "qwen3",
    "mistral": "llama3",
}
#: every registered format (one missing from `FAMILY_VOCAB` fails loudly)
FAMILIES = tool_format_names()


@functools.cache
def tokenizer_for(family: str) -> Tokenizer:
    cls = get_tool_format_class(family)
    return load_tokenizer(FAMILY_VOCAB[family]).with_special_tokens(cls.special_markers)


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
