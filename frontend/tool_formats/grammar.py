"""Building blocks of the constraints: xgrammar structural-tag formats as plain dicts,
the checks a tool set must pass, and the substrings kept out of free text.

A family writes its call layout once as text with its markers in it (for example
``"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>"``); `layout` turns the markers into
token formats, so a marker can only be generated as its single special token.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from structured_output import GrammarSpec, SpecKind

from .base import FunctionTool, ToolFormatError

if TYPE_CHECKING:
    from tokenization import Tokenizer

Format = dict[str, Any]

#: characters a character class of text keeps out (a regex class body): controls, and
#: surrogates, whose UTF-8 encodings xgrammar would otherwise admit but no decoder
#: reads (they come out as U+FFFD, one per byte)
NOT_TEXT = r"\x00-\x1f\ud800-\udfff"


def const(text: str) -> Format:
    return {"type": "const_string", "value": text}


def token(marker: str) -> Format:
    """Exactly the special token ``marker`` (never its text spelled in pieces)."""
    return {"type": "token", "token": marker}


def seq(*parts: Format) -> Format:
    """The parts in order; nested sequences are flattened and empty strings dropped."""
    flat: list[Format] = []
    for p in parts:
        if p["type"] == "sequence":
            flat.extend(p["elements"])
        elif not (p["type"] == "const_string" and not p["value"]):
            flat.append(p)
    if not flat:
        return const("")
    return flat[0] if len(flat) == 1 else {"type": "sequence", "elements": flat}


def alt(parts: Iterable[Format]) -> Format:
    """One of the parts."""
    items = list(parts)
    if not items:
        raise ValueError("an alternative needs at least one part")
    return items[0] if len(items) == 1 else {"type": "or", "elements": items}


def optional(part: Format) -> Format:
    return {"type": "optional", "content": part}


def star(part: Format) -> Format:
    return {"type": "star", "content": part}


def regex(pattern: str) -> Format:
    return {"type": "regex", "pattern": pattern}


def any_text(excludes: Collection[str]) -> Format:
    """Free text holding none of ``excludes``, nor a NUL: special tokens are sealed
    behind one in the grammar's view (structured_output/vocab.py), so text that admits
    a NUL admits every special token (``</think>``, another family's markers). It ends
    where the text after it begins."""
    return {"type": "any_text", "excludes": sorted({*excludes, "\x00"})}


def tag(begin: str | Format, content: Format, end: str | Format) -> Format:
    """``begin content end``, where ``begin``/``end`` are text or a `token`."""
    return {"type": "tag", "begin": begin, "content": content, "end": end}


@dataclass(frozen=True)
class FreeText:
    """What free text inside a call (argument strings, property names, raw values)
    may not hold: ``excludes``, substrings that cover every marker the parser reacts
    to there (and the vocabulary's bracketed special tokens); and ``barred``, the
    first characters of those markers, kept out of strings whose length is bounded
    (xgrammar drops length bounds on filtered strings, so those become patterns)."""

    excludes: tuple[str, ...]
    barred: str

    @classmethod
    def build(
        cls, tokenizer: Tokenizer, markers: Iterable[str], covers: Iterable[str] = ()
    ) -> FreeText:
        """Rules for ``markers``, each kept out by itself or by one of ``covers``
        (shorter substrings of it, which cost xgrammar less to compile)."""
        vocab = vocabulary_covers(tokenizer)
        markers = list(markers)
        covers = list(covers)
        for m in markers:
            if not any(c in m for c in covers):
                covers.append(m)
        first = sorted({m[0] for m in markers} | {c[0] for c in vocab})
        return cls(tuple(minimal_excludes([*covers, *vocab])), "".join(first))

    def bounded_string(self, min_length: int, max_length: int | None) -> str:
        """A pattern for a string of ``min_length`` to ``max_length`` characters
        without the barred characters (nor quotes, backslashes or control characters,
        which a pattern-matched JSON string cannot escape, nor surrogates)."""
        bar = re.escape(self.barred)
        upper = "" if max_length is None else str(max_length)
        return f'^[^{bar}{NOT_TEXT}\\\\"]{{{min_length},{upper}}}$'


#: the longest ``maxLength`` enforced (as a pattern: xgrammar expands a bounded
#: repetition into states, about 20 ms of compile time per character)
MAX_ENFORCED_LENGTH = 32


def _bound_lengths(schema: Any, free: FreeText) -> Any:
    """``schema`` with each length-bounded plain string turned into a pattern (up to
    `MAX_ENFORCED_LENGTH`; a longer ``maxLength`` is not enforced)."""
    if isinstance(schema, list):
        return [_bound_lengths(v, free) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _bound_lengths(v, free) for k, v in schema.items()}
    lengths = "minLength" in out or "maxLength" in out
    plain = not any(k in out for k in ("pattern", "format", "enum", "const"))
    if lengths and plain and out.get("type") == "string":
        low = int(out.pop("minLength", 0))
        high = out.pop("maxLength", None)
        if high is not None and int(high) > MAX_ENFORCED_LENGTH:
            high = None
        if low or high is not None:
            out["pattern"] = free.bounded_string(low, None if high is None else int(high))
    return out


def json_value(schema: Any, free: FreeText) -> Format:
    """A JSON value of ``schema``, no marker in its strings or property names. Its
    whitespace is bounded by the engine, as for every constraint (the engine's
    ``max_whitespace``; see `structured_output.guard`)."""
    fmt: Format = {"type": "json_schema", "json_schema": _bound_lengths(schema, free)}
    if free.excludes:
        fmt["excludes"] = list(free.excludes)
    return fmt


def layout(text: str, markers: Collection[str]) -> Format:
    """``text`` with every marker in it as its special token and the rest literal."""
    if not markers:
        return const(text)
    pattern = re.compile("|".join(map(re.escape, sorted(markers, key=len, reverse=True))))
    parts: list[Format] = []
    pos = 0
    for m in pattern.finditer(text):
        parts.append(const(text[pos : m.start()]))
        parts.append(token(m.group()))
        pos = m.end()
    parts.append(const(text[pos:]))
    return seq(*parts)


def repeated(call: Format, *, separator: Format, parallel: bool) -> Format:
    """One call, or (``parallel``) one or more calls with ``separator`` between them."""
    if not parallel:
        return call
    return seq(call, star(seq(separator, call)))


def structural_tag(fmt: Format) -> GrammarSpec:
    return GrammarSpec(
        SpecKind.STRUCTURAL_TAG, json.dumps({"type": "structural_tag", "format": fmt})
    )


_API_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,256}")
#: what `api_name_ok` accepts, for error messages
API_NAME_SYNTAX = "1-256 letters, digits, '_', '.' or '-'"


def api_name_ok(name: str) -> bool:
    """A name that markup syntaxes carry as is (OpenAI's names, plus '.')."""
    return _API_NAME.fullmatch(name) is not None


def select_tools(
    format_name: str,
    tools: Sequence[FunctionTool],
    named: str | None,
    name_ok: Callable[[str], bool],
    syntax: str,
) -> list[FunctionTool]:
    """The tools a constraint offers: all of ``tools``, or just ``named``. Each must
    have a name ``name_ok`` accepts (``syntax`` says which names those are)."""
    if not tools:
        raise ToolFormatError("a forced tool call needs at least one tool")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ToolFormatError(f"tool names must be unique; repeated: {', '.join(dup)}")
    chosen = list(tools)
    if named is not None:
        chosen = [t for t in tools if t.name == named]
        if not chosen:
            raise ToolFormatError(f"the named function {named!r} is not among the tools")
    for t in chosen:
        if not name_ok(t.name):
            raise ToolFormatError(
                f"tool-call format {format_name!r} cannot carry the tool name {t.name!r}: "
                f"names must be {syntax}"
            )
    return chosen


def vocabulary_covers(tokenizer: Tokenizer) -> list[str]:
    """Short substrings that keep the vocabulary's bracketed special tokens (``<|...|>``,
    DeepSeek's ``<｜...｜>``) out of free text. Excluding whole special-token texts
    costs xgrammar about 13 ms of compile time per character per JSON value, so a
    cheap cover is used where one exists; special tokens without one (such as Qwen's
    ``<think>``) are kept out only where they are the family's own markers."""
    covers = []
    if any(t.startswith("<|") for t in tokenizer.special_tokens):
        covers.append("<|")
    if any("｜" in t for t in tokenizer.special_tokens):
        covers.append("｜")
    return covers


def minimal_excludes(texts: Iterable[str]) -> list[str]:
    """``texts`` without duplicates and without any text that holds another one (an
    exclude already keeps out every text that contains it)."""
    unique = sorted(set(texts), key=len)
    kept: list[str] = []
    for t in unique:
        if not any(k in t for k in kept):
            kept.append(t)
    return sorted(kept)
