"""The front end's flags, parsed as a command line would give them."""

from __future__ import annotations

import argparse

import pytest

from engine_core.config import add_engine_arguments
from frontend.config import ConfigError, add_frontend_arguments, frontend_config_from_args


def parse(argv: list[str], *, with_engine: bool = False):
    parser = argparse.ArgumentParser()
    if with_engine:
        add_engine_arguments(parser)
    add_frontend_arguments(parser, reasoning_flags=not with_engine)
    return frontend_config_from_args(parser.parse_args(argv))


def test_vllm_style_flags():
    cfg = parse(
        [
            "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes",
            "--tool-parser-plugin", "my_formats.py",
            "--reasoning-parser", "qwen3",
            "--reasoning-parser-plugin", "my_parsers",
        ]
    )  # fmt: skip
    assert cfg.enable_auto_tool_choice and cfg.tool_call_parser == "hermes"
    assert cfg.tool_parser_plugin == "my_formats.py"
    assert (cfg.reasoning_parser, cfg.reasoning_parser_plugin) == ("qwen3", "my_parsers")
    assert cfg.tool_call_constraint == "structural_tag"


def test_enable_auto_tool_choice_needs_a_parser():
    with pytest.raises(ConfigError, match="--enable-auto-tool-choice requires --tool-call-parser"):
        parse(["--enable-auto-tool-choice"])


def test_a_parser_without_auto_is_allowed():
    cfg = parse(["--tool-call-parser", "hermes"])
    assert cfg.tool_call_parser == "hermes" and not cfg.enable_auto_tool_choice


def test_shares_the_reasoning_flags_with_the_engine():
    cfg = parse(["--reasoning-parser", "qwen3", "--tool-call-parser", "hermes"], with_engine=True)
    assert cfg.reasoning_parser == "qwen3"


def test_bad_values():
    with pytest.raises(SystemExit):
        parse(["--tool-call-constraint", "regex"])
    with pytest.raises(ConfigError, match="--default-max-tokens"):
        parse(["--default-max-tokens", "0"])
