"""oneOf read as anyOf where its branches provably cannot both match a value.

xgrammar enforces ``oneOf`` exactly only where it proves the branches exclusive; it
falls back to ``anyOf`` (a value could then match two branches) elsewhere. Here the
normalized branches are compared pairwise: different JSON types, disjoint finite
value sets, or two object schemas that both require a property whose values differ
(a discriminator). Where that holds, anyOf means the same as oneOf."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .json_schemas import json_equal, json_type, types_of

if TYPE_CHECKING:
    from .json_schemas import Normalizer, Schema

_NUMBERS = {"integer", "number"}


def disjoint(n: Normalizer, branches: list[Schema]) -> bool:
    """Whether no value matches two of these normalized branches."""
    return all(
        _apart(n, branches[i], branches[j])
        for i in range(len(branches))
        for j in range(i + 1, len(branches))
    )


def _describe(n: Normalizer, node: Schema) -> tuple[set[str] | None, list[Any] | None]:
    """(the types a normalized node admits, or None: any; its values if finite)."""
    node = n.target(node)
    if "enum" in node:
        return {json_type(v) for v in node["enum"]}, node["enum"]
    if "anyOf" in node:
        types: set[str] = set()
        values: list[Any] | None = []
        for b in node["anyOf"]:
            t, v = _describe(n, b)
            if t is None:
                return None, None
            types |= t
            values = None if v is None or values is None else values + v
        return types, values
    if "type" in node:
        return set(types_of(node["type"])), None
    return None, None


def _overlap(a: set[str], b: set[str]) -> bool:
    return bool(a & b) or bool(a & _NUMBERS and b & _NUMBERS)


def _apart(n: Normalizer, x: Schema, y: Schema) -> bool:
    (tx, vx), (ty, vy) = _describe(n, x), _describe(n, y)
    if vx is not None and vy is not None:
        return not any(json_equal(a, b) for a in vx for b in vy)
    if tx is not None and ty is not None and not _overlap(tx, ty):
        return True
    return _discriminated(n, n.target(x), n.target(y))


def _discriminated(n: Normalizer, x: Schema, y: Schema) -> bool:
    """Two object schemas that both require a property whose values differ."""
    if x.get("type") != "object" or y.get("type") != "object":
        return False
    for name in set(x.get("required", ())) & set(y.get("required", ())):
        _, vx = _describe(n, x["properties"][name])
        _, vy = _describe(n, y["properties"][name])
        if vx is not None and vy is not None and not any(json_equal(a, b) for a in vx for b in vy):
            return True
    return False
