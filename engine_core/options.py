"""Settings described once, as dataclass fields with their flag and help.

A field made with `option` carries in its metadata what the command line needs:
``help`` (required), and optionally ``flag`` (default: ``--`` and the field name with
dashes), ``metavar``, ``choices``, ``default_text`` (how ``--help`` shows a default
that is computed, such as "the model directory, else qwen3") and ``hidden``. The
argparse arguments and the flags that reproduce a config are both derived from this
one table (see `config.py`). Packages below ``engine_core`` describe their settings
with the same metadata keys, written as a plain dict.

Light on imports on purpose: ``python -m engine_core --help`` reads it before torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def option(
    default: Any,
    help: str,  # noqa: A002 - the argparse name
    *,
    flag: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    default_text: str | None = None,
    hidden: bool = False,
) -> Any:
    """A dataclass field with its command-line description. A mutable default (a
    dict) is copied per instance."""
    meta = {"help": help}
    for key, value in (
        ("flag", flag),
        ("metavar", metavar),
        ("choices", choices),
        ("default_text", default_text),
    ):
        if value is not None:
            meta[key] = value
    if hidden:
        meta["hidden"] = True
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class OptionsError(ValueError):
    """Options that do not fit their class; the message lists the known ones."""


def read_options(cls: type[T], values: Mapping[str, Any], owner: str) -> T:
    """``values`` (JSON-like, from ``--runner-options``) as an instance of the
    dataclass ``cls``, each value checked against its field's type. ``owner`` names
    whose options these are, for the message."""
    import msgspec

    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise OptionsError(
            f"{owner} has no option {', '.join(map(repr, unknown))}; {describe_options(cls)}"
        )
    try:
        return msgspec.convert(dict(values), type=cls)
    except msgspec.ValidationError as e:
        raise OptionsError(f"bad option of {owner}: {e}; {describe_options(cls)}") from None


def describe_options(cls: type) -> str:
    """One line: each option with its default and help."""
    fields = dataclasses.fields(cls)
    if not fields:
        return "it takes no options"
    parts = [
        f"{f.name} (default {_default(f)!r}): {f.metadata.get('help', '')}".rstrip(": ")
        for f in fields
    ]
    return "its options: " + "; ".join(parts)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default
