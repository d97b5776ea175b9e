"""The front end's settings, and the command-line flags that set them.

The flags follow vLLM's serving layer:

- ``--enable-auto-tool-choice`` with ``--tool-call-parser NAME`` turns on tool-call
  parsing for ``tool_choice: "auto"``. The first without the second stops the start-up
  (`ConfigError`). The second without the first loads the format (so that forced calls,
  "required" or a named function, are constrained and parsed in the family's syntax),
  but a request with ``tool_choice: "auto"`` is refused, as vLLM refuses it.
- Forced calls need no flag: without ``--tool-call-parser`` (or with
  ``--tool-call-constraint json_schema``) they are forced as plain JSON, the
  JSON-schema way, and read back as such.
- ``--tool-parser-plugin`` / ``--reasoning-parser-plugin`` import a module (a ``.py``
  file or a dotted name) that registers more formats or parsers.
- ``--reasoning-parser NAME`` must name the engine's parser (or be left out: the front
  end then takes the engine's), since both sides must find the end of thinking alike.

An unknown name stops the start-up with a message that lists the known ones.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Literal

#: how "required" and named tool choices are forced: in the family's own call syntax
#: (a structural tag), or as a plain JSON schema read back without the family's markers
ToolCallConstraint = Literal["structural_tag", "json_schema"]


class ConfigError(ValueError):
    """The front end's flags cannot work together; the message says which and why."""


@dataclass
class FrontendConfig:
    #: the tool-call format (``--tool-call-parser``); None: no family format
    tool_call_parser: str | None = None
    #: ``tool_choice: "auto"`` allowed (needs ``tool_call_parser``)
    enable_auto_tool_choice: bool = False
    tool_parser_plugin: str | None = None
    #: None: the engine's reasoning parser (as its handshake names it)
    reasoning_parser: str | None = None
    reasoning_parser_plugin: str | None = None
    #: a template file, a built-in template name, or None: the tokenizer's own, else the
    #: built-in template of the bundled vocabulary
    chat_template: str | None = None
    tool_call_constraint: ToolCallConstraint = "structural_tag"
    #: ``max_tokens`` of a request that sets none
    default_max_tokens: int = 1024
    #: the ``model`` field of responses (default: the engine's model name)
    served_model_name: str | None = None

    def check(self) -> None:
        """Raise `ConfigError` for flags that contradict each other."""
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ConfigError(
                "--enable-auto-tool-choice requires --tool-call-parser NAME to be set "
                "(the format that reads the model's tool calls)"
            )
        if self.tool_call_constraint not in ("structural_tag", "json_schema"):
            raise ConfigError(
                f"--tool-call-constraint must be structural_tag or json_schema, "
                f"not {self.tool_call_constraint!r}"
            )
        if self.default_max_tokens < 1:
            raise ConfigError("--default-max-tokens must be at least 1")


def add_frontend_arguments(
    parser: argparse.ArgumentParser, *, reasoning_flags: bool = True
) -> None:
    """Add the front end's flags. ``reasoning_flags`` False leaves out
    ``--reasoning-parser`` and ``--reasoning-parser-plugin``, for a parser that already
    has the engine's flags of the same names (both sides then use the same values)."""
    d = FrontendConfig()
    a = parser.add_argument
    a(
        "--enable-auto-tool-choice",
        action="store_true",
        help='allow tool_choice "auto": the model decides, --tool-call-parser reads its calls',
    )
    a(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="the tool-call format of the model (hermes, qwen3_coder, llama3_json, ...)",
    )
    a(
        "--tool-parser-plugin",
        default=None,
        metavar="PATH",
        help="module or .py file that registers more tool-call formats",
    )
    if reasoning_flags:
        a(
            "--reasoning-parser",
            default=None,
            metavar="NAME",
            help="the reasoning parser (default: the engine's)",
        )
        a(
            "--reasoning-parser-plugin",
            default=None,
            metavar="PATH",
            help="module or .py file that registers more reasoning parsers",
        )
    a(
        "--chat-template",
        default=None,
        metavar="PATH_OR_NAME",
        help="a Jinja2 template file or a built-in template name (default: the tokenizer's "
        "own, else the built-in one of the bundled vocabulary)",
    )
    a(
        "--tool-call-constraint",
        default=d.tool_call_constraint,
        choices=["structural_tag", "json_schema"],
        help='how "required" and named tool choices are forced',
    )
    a(
        "--default-max-tokens",
        type=int,
        default=d.default_max_tokens,
        help="max_tokens of a request that sets none",
    )
    a(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model name of the API (requests' model field, responses, /v1/models; "
        "default: the engine's --model)",
    )


def frontend_config_from_args(ns: argparse.Namespace) -> FrontendConfig:
    """The config the flags of `add_frontend_arguments` describe, checked."""
    d = FrontendConfig()
    config = FrontendConfig(
        **{f.name: getattr(ns, f.name, getattr(d, f.name)) for f in fields(FrontendConfig)}
    )
    config.check()
    return config
