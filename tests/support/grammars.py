"""Grammars the engine tests share, with checks of their outputs that do not use
xgrammar: the hermes family's "required" constraint (`bench.states.hermes_tag`, built
by `create_tool_format` as the front end and the benchmarks build it), a small
arithmetic EBNF and its recursive-descent parser."""

from __future__ import annotations

import json
import re

import jsonschema

from bench.states import hermes_tag

__all__ = ["ARITHMETIC", "hermes_calls_valid", "hermes_tag", "is_arithmetic"]

#: sums of positive integers and parenthesised sums: ``12 + (3 + 4)``
ARITHMETIC = r"""
root ::= expr
expr ::= term (" + " term)*
term ::= num | "(" expr ")"
num ::= [1-9] [0-9]*
"""

_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", flags=re.S)


def is_arithmetic(s: str) -> bool:
    """Whether ``s`` is a sentence of `ARITHMETIC`."""
    pos = 0

    def term() -> bool:
        nonlocal pos
        if s.startswith("(", pos):
            pos += 1
            if not expr() or not s.startswith(")", pos):
                return False
            pos += 1
            return True
        m = re.match(r"[1-9][0-9]*", s[pos:])
        if not m:
            return False
        pos += m.end()
        return True

    def expr() -> bool:
        nonlocal pos
        if not term():
            return False
        while s.startswith(" + ", pos):
            pos += 3
            if not term():
                return False
        return True

    return expr() and pos == len(s)


def hermes_calls_valid(text: str, tools: list[dict]) -> bool:
    """Whether ``text`` is one or more calls of `hermes_tag` (``tools``) and nothing
    else, each naming one of ``tools`` with arguments valid for its schema. Raises
    `ValueError` / `jsonschema.ValidationError` on a call that does not parse or
    validate."""
    calls = _CALL.findall(text)
    if not calls or _CALL.sub("", text).strip():
        return False
    by_name = {t["name"]: t["parameters"] for t in tools}
    for c in calls:
        obj = json.loads(c)
        if obj["name"] not in by_name:
            return False
        jsonschema.validate(obj["arguments"], by_name[obj["name"]])
    return True
