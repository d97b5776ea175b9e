"""The reasoning registry: names, errors, plugins, and every family's marker
validation (parametrized from the registry, so a new family cannot go untested)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reasoning import (
    REASONING_PARSERS,
    ReasoningError,
    create_reasoning_parser,
    get_reasoning_parser_class,
    load_plugin,
    reasoning_parser_names,
)
from tokenization import Tokenizer

from .cases import CASES

#: the built-in families (none may go missing from the registry)
BUILT_IN = (
    "qwen3",
    "deepseek_r1",
    "deepseek_v3",
    "glm45",
    "kimi_k2",
    "minimax_m2",
    "seed_oss",
    "mistral",
    "granite",
    "hunyuan_a13b",
    "ernie45",
    "olmo3",
    "cohere_command",
    "openai_gptoss",
)


def test_every_family_is_registered() -> None:
    assert set(BUILT_IN) <= set(reasoning_parser_names())
    assert reasoning_parser_names() == REASONING_PARSERS.names()


def test_every_family_has_property_cases() -> None:
    """The property suite (`cases.CASES`) covers every registered family."""
    assert {c.parser for c in CASES} >= set(reasoning_parser_names())


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError) as err:
        get_reasoning_parser_class("no_such_family")
    message = str(err.value)
    assert message.startswith("unknown reasoning parser 'no_such_family'; known: ")
    for name in reasoning_parser_names():
        assert name in message


@pytest.mark.parametrize("name", reasoning_parser_names())
def test_family_builds_on_a_base_vocabulary_with_its_markers(
    name: str, llama3: Tokenizer, harmony: Tokenizer
) -> None:
    cls = get_reasoning_parser_class(name)
    base = harmony if name == "openai_gptoss" else llama3
    parser = create_reasoning_parser(name, base.with_special_tokens(cls.special_markers))
    assert parser.name == name
    for tid in parser.implicit_end_ids:
        assert parser.tokenizer.is_special(tid)


def test_one_class_under_two_names(qwen3: Tokenizer, llama3: Tokenizer) -> None:
    """Registering does not write the name onto the class: each name keeps its own."""
    cls = get_reasoning_parser_class("qwen3")
    REASONING_PARSERS.register("test_qwen3_alias")(cls)
    try:
        alias = create_reasoning_parser("test_qwen3_alias", qwen3)
        assert alias.name == "test_qwen3_alias"
        assert create_reasoning_parser("qwen3", qwen3).name == "qwen3"
        assert get_reasoning_parser_class("qwen3") is cls
        without_tool_call = llama3.with_special_tokens(["<think>", "</think>"])
        with pytest.raises(ReasoningError, match="'test_qwen3_alias'.*'<tool_call>'"):
            create_reasoning_parser("test_qwen3_alias", without_tool_call)
    finally:
        REASONING_PARSERS.unregister("test_qwen3_alias")
    assert "test_qwen3_alias" not in reasoning_parser_names()


@pytest.mark.parametrize(
    ("name", "present", "missing"),
    [
        ("qwen3", (), "<think>"),
        ("qwen3", ("<think>", "</think>"), "<tool_call>"),
        ("deepseek_r1", ("<think>",), "</think>"),
        ("deepseek_v3", (), "<think>"),
        ("glm45", ("<think>", "</think>"), "<tool_call>"),
        ("kimi_k2", ("<think>", "</think>"), "<|tool_calls_section_begin|>"),
        ("minimax_m2", (), "<think>"),
        ("seed_oss", ("<think>", "</think>"), "<seed:think>"),
        ("mistral", (), "[TOOL_CALLS]"),
        ("mistral", ("[/THINK]", "[TOOL_CALLS]"), "[THINK]"),
        ("ernie45", (), "<think>"),
        ("cohere_command", ("<|START_THINKING|>",), "<|END_THINKING|>"),
        ("openai_gptoss", ("<|start|>", "<|channel|>", "<|message|>"), "<|end|>"),
    ],
)
def test_missing_marker_names_parser_and_marker(
    name: str, present: tuple[str, ...], missing: str, llama3: Tokenizer
) -> None:
    with pytest.raises(ReasoningError) as err:
        create_reasoning_parser(name, llama3.with_special_tokens(present))
    assert repr(name) in str(err.value)
    assert repr(missing) in str(err.value)


def test_mistral_needs_both_think_tokens_or_neither(llama3: Tokenizer) -> None:
    half = llama3.with_special_tokens(["[THINK]", "[TOOL_CALLS]"])
    with pytest.raises(ReasoningError, match=r"'mistral'.*'\[/THINK\]'"):
        create_reasoning_parser("mistral", half)
    text_only = llama3.with_special_tokens(["[TOOL_CALLS]"])
    assert not create_reasoning_parser("mistral", text_only).special_think_tokens
    both = llama3.with_special_tokens(["[THINK]", "[/THINK]", "[TOOL_CALLS]"])
    assert create_reasoning_parser("mistral", both).special_think_tokens


def test_plugin_file_registers_a_parser(tmp_path: Path, qwen3: Tokenizer) -> None:
    plugin = tmp_path / "my_reasoning_plugin.py"
    plugin.write_text(
        textwrap.dedent(
            """
            from reasoning import register_reasoning_parser
            from reasoning.think_tags import ThinkTagsParser


            @register_reasoning_parser("test_plugin_think")
            class PluginThink(ThinkTagsParser):
                start_marker = "<think>"
                end_marker = "</think>"
            """
        )
    )
    load_plugin(str(plugin))
    try:
        assert "test_plugin_think" in reasoning_parser_names()
        parser = create_reasoning_parser("test_plugin_think", qwen3)
        assert parser.name == "test_plugin_think"
        ids = qwen3.encode("<think>why</think>because")
        assert parser.split(ids) == ("why", "because")
        load_plugin(str(plugin))  # loading the same file again is a no-op
    finally:
        REASONING_PARSERS.unregister("test_plugin_think")


def test_plugin_that_cannot_be_imported(tmp_path: Path) -> None:
    with pytest.raises(ImportError, match="no_such_plugin_module"):
        load_plugin("no_such_plugin_module")


def test_register_rejects_what_is_not_a_parser() -> None:
    from reasoning import register_reasoning_parser

    with pytest.raises(TypeError):
        register_reasoning_parser("test_not_a_parser")(int)  # type: ignore[arg-type]
