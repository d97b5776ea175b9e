"""Structured-output specs, their checks, and how each one compiles with xgrammar."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import xgrammar as xgr


class SpecKind(StrEnum):
    JSON_SCHEMA = "json_schema"  # value: the schema, JSON text
    JSON_OBJECT = "json_object"  # value: unused; any JSON object
    REGEX = "regex"  # value: the pattern
    CHOICE = "choice"  # value: a JSON list of the allowed strings
    GRAMMAR = "grammar"  # value: an EBNF grammar with a ``root`` rule
    STRUCTURAL_TAG = "structural_tag"  # value: xgrammar's structural tag, JSON text


class GrammarError(ValueError):
    """A request's grammar cannot be used; the message says why, for the user."""


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """Engine-wide compile settings (part of the cache key)."""

    #: the most whitespace characters allowed in a row between JSON elements, so that
    #: a sampler cannot loop on whitespace until max_tokens (None: no bound). JSON text
    #: is compiled unbounded and bounded by the guard (`guard.py`); free-text tags
    #: carry the bound in their grammar (`whitespace.py`)
    max_whitespace: int | None = 16
    #: the largest spec accepted, in bytes of its text
    max_spec_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.max_whitespace is not None and self.max_whitespace < 1:
            # xgrammar refuses a bound of 0 in the grammars that carry it
            raise ValueError("max_whitespace must be at least 1 (None: no bound)")


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    kind: SpecKind
    value: str = ""
    #: JSON schemas (also those inside a structural tag): leave out keywords the
    #: grammar cannot enforce, instead of refusing the spec (see `json_schemas`)
    ignore_unsupported: bool = False

    @classmethod
    def of(cls, kind: str, value: str = "", ignore_unsupported: bool = False) -> GrammarSpec:
        try:
            k = SpecKind(kind)
        except ValueError:
            known = ", ".join(k.value for k in SpecKind)
            raise GrammarError(f"unknown structured-output kind {kind!r}; known: {known}") from None
        return cls(k, value, ignore_unsupported)


_XGR_NOISE = re.compile(r"\[\d\d:\d\d:\d\d\] \S+?:\d+: |Check failed: \(.*?\) is false: ")


def clean_xgrammar_message(exc: BaseException) -> str:
    """xgrammar's message without its log prefix (time, C++ file, failed check)."""
    text = _XGR_NOISE.sub("", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_spec(spec: GrammarSpec, options: CompileOptions) -> None:
    """Cheap checks before compiling: size, and that JSON-valued specs parse."""
    size = len(spec.value.encode("utf-8"))
    if size > options.max_spec_bytes:
        raise GrammarError(
            f"{spec.kind.value} spec is {size} bytes, over the limit of {options.max_spec_bytes}"
        )
    if spec.kind in (SpecKind.JSON_SCHEMA, SpecKind.CHOICE, SpecKind.STRUCTURAL_TAG):
        try:
            value = json.loads(spec.value)
        except ValueError as e:
            raise GrammarError(f"{spec.kind.value} spec is not valid JSON: {e}") from None
        except RecursionError:
            raise GrammarError(f"{spec.kind.value} spec is nested too deeply") from None
        if spec.kind == SpecKind.JSON_SCHEMA and not isinstance(value, dict | bool):
            raise GrammarError("json_schema spec must be a JSON object (or a boolean)")
        if spec.kind == SpecKind.CHOICE and not (
            isinstance(value, list) and value and all(isinstance(c, str) for c in value)
        ):
            raise GrammarError("choice spec must be a non-empty JSON list of strings")
        if spec.kind == SpecKind.STRUCTURAL_TAG and not isinstance(value, dict):
            raise GrammarError("structural_tag spec must be a JSON object")
    elif spec.kind in (SpecKind.REGEX, SpecKind.GRAMMAR) and not spec.value:
        raise GrammarError(f"{spec.kind.value} spec is empty")


class Compiled(NamedTuple):
    grammar: xgr.CompiledGrammar
    #: everything it writes lexes as JSON text, so the guard bounds its whitespace
    #: (`whitespace.json_text`)
    json_text: bool


def compile_spec(
    compiler: xgr.GrammarCompiler,
    spec: GrammarSpec,
    options: CompileOptions,
    special_tokens: Mapping[str, int] | None = None,
) -> xgr.CompiledGrammar:
    """Compile ``spec``; a spec xgrammar rejects raises `GrammarError`.

    ``special_tokens`` (text -> id) are the vocabulary's sealed special tokens (see
    `vocab.py`): a structural tag's markers are bound and resolved against them."""
    return compile_constraint(compiler, spec, options, special_tokens).grammar


def compile_constraint(
    compiler: xgr.GrammarCompiler,
    spec: GrammarSpec,
    options: CompileOptions,
    special_tokens: Mapping[str, int] | None = None,
) -> Compiled:
    """`compile_spec`, and whether the result is JSON text."""
    check_spec(spec, options)
    from .json_schemas import normalize_spec

    try:
        spec = normalize_spec(spec).spec  # JSON schemas as xgrammar enforces them exactly
        return _compile(compiler, spec, options, special_tokens or {})
    except GrammarError:
        raise
    except (RuntimeError, ValueError, TypeError, LookupError, AttributeError) as e:
        raise GrammarError(f"invalid {spec.kind.value}: {clean_xgrammar_message(e)}") from None


def too_large(size_bytes: int, limit_bytes: int) -> str | None:
    """Why a compiled grammar of ``size_bytes`` in memory is refused (None: it is not;
    a limit of 0 accepts any)."""
    if 0 < limit_bytes < size_bytes:
        return (
            f"the compiled grammar is too large: {size_bytes >> 20} MiB in memory, "
            f"over the limit of {limit_bytes >> 20} MiB"
        )
    return None


def compile_bounded(
    compiler: xgr.GrammarCompiler,
    spec: GrammarSpec,
    options: CompileOptions,
    special_tokens: Mapping[str, int] | None,
    max_compiled_bytes: int,
) -> Compiled:
    """`compile_constraint`, refusing (`GrammarError`) a grammar that takes more than
    ``max_compiled_bytes`` of memory once compiled (0: any size), or that runs out of
    memory while compiling. What a compile worker and the engine's own compiles
    (``--compile-workers 0``) both run."""
    try:
        compiled = compile_constraint(compiler, spec, options, special_tokens)
    except MemoryError:
        raise GrammarError("grammar is too large to compile") from None
    error = too_large(int(compiled.grammar.memory_size_bytes), max_compiled_bytes)
    if error is not None:
        raise GrammarError(error)
    return compiled


def _compile(
    compiler: xgr.GrammarCompiler,
    spec: GrammarSpec,
    options: CompileOptions,
    special_tokens: Mapping[str, int],
) -> Compiled:
    # JSON is compiled with unbounded whitespace: the guard bounds it (see guard.py)
    if spec.kind == SpecKind.JSON_SCHEMA:
        return Compiled(compiler.compile_json_schema(spec.value, any_whitespace=True), True)
    if spec.kind == SpecKind.JSON_OBJECT:
        grammar = compiler.compile_json_schema(
            '{"type": "object"}', any_whitespace=True, strict_mode=False
        )
        return Compiled(grammar, True)
    if spec.kind == SpecKind.REGEX:
        return Compiled(compiler.compile_regex(spec.value), False)
    if spec.kind == SpecKind.CHOICE:
        choices = json.loads(spec.value)
        fmt: dict[str, Any] = {
            "type": "or",
            "elements": [{"type": "const_string", "value": c} for c in choices],
        }
        return Compiled(
            compiler.compile_structural_tag({"type": "structural_tag", "format": fmt}), False
        )
    if spec.kind == SpecKind.GRAMMAR:
        return Compiled(compiler.compile_grammar(spec.value), False)
    if spec.kind == SpecKind.STRUCTURAL_TAG:
        from .structural_tags import prepare_structural_tag
        from .whitespace import bound_in_grammar, json_text

        tag = json.loads(prepare_structural_tag(json.loads(spec.value), special_tokens))
        lexed = json_text(tag)
        if not lexed:
            tag = bound_in_grammar(tag, options.max_whitespace)
        return Compiled(compiler.compile_structural_tag(json.dumps(tag)), lexed)
    raise GrammarError(f"unsupported structured-output kind {spec.kind!r}")
