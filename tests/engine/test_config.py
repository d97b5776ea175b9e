"""The engine's settings: one table of fields, from which the flags, ``--help`` and the
flags that reproduce a config (for a spawned engine) all derive."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_core.config import (
    EngineConfig,
    _base,
    _fields,
    _optional,
    add_engine_arguments,
    config_from_args,
    flag_of,
)
from engine_core.model_options import RandomOptions, ScriptedOptions
from engine_core.options import OptionsError, read_options
from structured_output.config import StructuredOutputConfig
from tests.support.processes import ROOT


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="engine")
    add_engine_arguments(p)
    return p


def _parse(argv: list[str]) -> EngineConfig:
    return config_from_args(_parser().parse_args(argv))


def test_every_setting_has_its_own_flag_and_a_help_text():
    flags = [flag_of(f) for _, f, _ in _fields(EngineConfig)]
    assert len(flags) == len(set(flags)), flags
    for dest, f, _ in _fields(EngineConfig):
        assert f.metadata.get("help"), dest


def test_help_shows_every_default_and_no_markup():
    text = _parser().format_help()
    assert "``" not in text
    for dest, f, _ in _fields(EngineConfig):
        if f.metadata.get("hidden"):
            assert flag_of(f) not in text
            continue
        action = next(a for a in _parser()._actions if a.dest == dest)
        assert "(default: " in action.help, dest
    assert "--json-max-whitespace" in text and "(default: 16)" in text


def test_defaults_are_the_dataclass_defaults():
    assert _parse([]) == EngineConfig()
    assert _parse([]).structured_output == StructuredOutputConfig()


def test_json_max_whitespace_reaches_the_structured_output_config():
    config = _parse(["--json-max-whitespace", "3", "--compile-workers", "1"])
    assert config.structured_output.max_whitespace == 3
    assert config.structured_output.compile_workers == 1
    assert config.to_args() == ["--json-max-whitespace=3", "--compile-workers=1"]
    unbounded = _parse(["--json-max-whitespace", "none"])
    assert unbounded.structured_output.max_whitespace is None
    assert unbounded.to_args() == ["--json-max-whitespace=none"]
    with pytest.raises(SystemExit):
        _parser().parse_args(["--json-max-whitespace", "many"])


def test_repeatable_and_json_flags():
    config = _parse(
        [
            "--extra-special-token",
            "<a>",
            "--extra-special-token",
            "<b>",
            "--runner-options",
            '{"forward_ms": 5, "ending_texts": ["</x>"]}',
        ]
    )
    assert config.extra_special_tokens == ("<a>", "<b>")
    assert config.runner_options == {"forward_ms": 5, "ending_texts": ["</x>"]}
    with pytest.raises(SystemExit):
        _parser().parse_args(["--runner-options", "[1]"])


def _value(declared, default, choices=None):
    if choices:
        return st.sampled_from(choices)
    hint = _base(declared)
    if _optional(declared) and default is not None:  # spelled "none" on the command line
        return st.none() | _value(hint, default)
    hint = typing.get_origin(hint) or hint
    text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=8)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-(10**6), 10**9)
    if hint is float:
        return st.floats(-1e6, 1e6, allow_nan=False)
    if hint is str:
        return text
    if hint is tuple:
        return st.lists(text, max_size=3).map(tuple)
    if hint is dict:
        return st.dictionaries(text, st.integers() | text | st.lists(text, max_size=2), max_size=3)
    raise AssertionError(hint)


@st.composite
def configs(draw) -> EngineConfig:
    """Any config: each setting its default or a value of its type."""
    values: dict[str, object] = {}
    for dest, f, hint in _fields(EngineConfig):
        if draw(st.booleans()):
            values[dest] = draw(_value(hint, f.default, f.metadata.get("choices")))
    so = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("structured_output.")}
    top = {k: v for k, v in values.items() if "." not in k}
    return EngineConfig(**top, structured_output=StructuredOutputConfig(**so))


@settings(max_examples=200, deadline=None)
@given(configs())
def test_to_args_reproduces_any_config(config):
    assert _parse(config.to_args()) == config


def test_a_value_of_two_dashes_survives_the_command_line(capsys):
    """argparse before Python 3.13 drops a value of exactly ``--`` (the property above
    draws one now and then): single, repeated and runner-option flags keep it, and a
    number flag refuses it by name."""
    config = EngineConfig(
        tokenizer="--",
        reasoning_parser_plugin="--",
        extra_special_tokens=("--", "-x", "--"),
        runner_options={"ending_texts": ["--"]},
    )
    assert _parse(config.to_args()) == config
    assert _parse(["--ending-text=--"]).runner_options == {"ending_texts": ["--"]}
    with pytest.raises(SystemExit):
        _parse(["--max-num-seqs=--"])
    assert "argument --max-num-seqs: invalid value: '--'" in capsys.readouterr().err


def test_flags_cannot_set_a_default_back_to_none():
    with pytest.raises(ValueError, match="cannot be set back"):
        dataclasses.replace(EngineConfig(), model=None).to_args()  # type: ignore[arg-type]


def test_help_parses_before_anything_heavy_loads():
    code = (
        "import sys\n"
        "from engine_core.__main__ import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0\n"
        "heavy = ['torch', 'xgrammar', 'zmq', 'numpy', 'transformers']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ----- the runners' own options ---------------------------------------------------------


def test_runner_options_are_read_into_the_runners_dataclass():
    o = read_options(RandomOptions, {"forward_ms": 20, "ending_texts": ["</x>"]}, "random")
    assert o == RandomOptions(forward_ms=20.0, closing_bias=3.0, ending_texts=("</x>",))
    assert read_options(ScriptedOptions, {"script": "s.json"}, "scripted").script == "s.json"


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"forward_ms": "fast"}, ["forward_ms", "float"]),
        ({"forwardms": 1}, ["'forwardms'", "forward_ms (default 0.0)", "closing_bias"]),
        ({"script": "x"}, ["'script'", "ending_texts"]),
    ],
)
def test_runner_options_that_do_not_fit_are_named_with_the_known_ones(values, words):
    with pytest.raises(OptionsError) as e:
        read_options(RandomOptions, values, "model runner RandomLogitsRunner")
    for w in words:
        assert w in str(e.value)


def test_the_built_in_models_options_are_flags_too():
    config = _parse(
        ["--model", "scripted", "--script", "s.json", "--forward-ms", "5", "--ending-text", "x"]
    )
    assert config.runner_options == {"script": "s.json", "forward_ms": 5.0, "ending_texts": ["x"]}
    both = _parse(["--runner-options", '{"forward_ms": 1, "closing_bias": 2}', "--forward-ms", "7"])
    assert both.runner_options == {"forward_ms": 7.0, "closing_bias": 2}
    assert _parse([]).runner_options == {}
    text = _parser().format_help()
    assert "--script FILE" in text and "--ending-text TEXT" in text
    assert "(default: 0.0)" in text  # forward_ms, the model's own default


def test_runner_options_travel_whole_to_a_spawned_engine():
    config = EngineConfig(runner_options={"ending_texts": ["</a b>", "x"], "forward_ms": 1.5})
    args = config.to_args()
    assert args == ["--runner-options=" + json.dumps(config.runner_options)]
    assert _parse(args).runner_options == config.runner_options
