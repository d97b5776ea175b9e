"""Seeded random schemas that contradict themselves the way real tool schemas do.

Real tool definitions say ``"type": "integer"`` with ``"enum": ["1", "2", "dontcare"]``,
``"type": "boolean"`` with ``["True", "False"]``, ``"type": "array"`` with an enum of
strings, a ``const`` of the wrong type, an enum member outside the property's range or
pattern. `contradiction` draws one such property (and says whether any value fits
it); `contradictory_object` builds parameters around them, with normal parameters
from `toolsets.SCALARS`, nested objects, arrays, ``$defs`` references, anyOf/oneOf
branches and allOf parts, each contradiction at any of those depths. Only properties
some value fits are required, unless a caller asks for a required one that none fits.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

from frontend.tool_formats import FunctionTool

from .toolsets import NOUNS, SCALARS, VERBS

Schema = dict[str, Any]
Maker = Callable[[random.Random], Schema]


def _pick(rng: random.Random, values: list[Any], k: int) -> list[Any]:
    return rng.sample(values, min(k, len(values)))


#: (maker, whether some value fits)
SHAPES: list[tuple[Maker, bool]] = [
    # the shapes of real tool sets
    (lambda r: {"type": "integer", "enum": ["1", "2", "3", "dontcare"]}, False),
    (lambda r: {"type": "integer", "enum": _pick(r, ["1", "2", "dontcare"], 2) + [4]}, True),
    (lambda r: {"type": "boolean", "enum": ["True", "False"]}, False),
    (lambda r: {"type": "boolean", "enum": ["true", False]}, True),
    (lambda r: {"type": "array", "enum": ["wifi", "parking", "pool"]}, False),
    (
        lambda r: {"type": "array", "items": {"type": "string"}, "enum": ["wifi", ["pool"]]},
        True,
    ),
    (lambda r: {"type": "string", "enum": [1, 2, 3]}, False),
    (lambda r: {"type": "string", "enum": [1, "two", 3.5]}, True),
    (lambda r: {"type": "number", "enum": ["1.5", "2.5", True]}, False),
    (lambda r: {"type": "number", "enum": ["1.5", 2.5, None]}, True),
    (lambda r: {"type": "string", "const": 5}, False),
    (lambda r: {"type": "integer", "const": "5"}, False),
    (lambda r: {"type": "integer", "const": 5}, True),
    (lambda r: {"type": "object", "enum": ["{}", "none"]}, False),
    (lambda r: {"type": "null", "enum": ["null", "None"]}, False),
    # members outside the other keywords
    (lambda r: {"type": "integer", "minimum": 3, "enum": [1, 2, r.randint(3, 9)]}, True),
    (lambda r: {"type": "integer", "maximum": 0, "enum": [1, 2]}, False),
    (lambda r: {"type": "string", "maxLength": 3, "enum": ["abcd", "ab"]}, True),
    (lambda r: {"type": "string", "pattern": "^[a-z]+$", "enum": ["ABC", "abc", "a1"]}, True),
    (lambda r: {"type": "string", "pattern": "^[0-9]{5}$", "enum": ["1234", "abcde"]}, False),
    (lambda r: {"type": ["integer", "null"], "enum": ["x", None, 3]}, True),
    (lambda r: {"type": ["string", "integer"], "enum": [True, 2.5, []]}, False),
    (lambda r: {"type": "integer", "enum": [1.0, 2.5, "3"]}, True),
    # at other depths: references, branches, parts, items
    (lambda r: {"$ref": "#/$defs/Level", "enum": ["high", 2]}, True),
    (lambda r: {"$ref": "#/$defs/Level", "enum": ["medium", 4]}, False),
    (lambda r: {"$ref": "#/$defs/Count"}, False),
    (
        lambda r: {
            "anyOf": [{"type": "integer", "enum": ["a"]}, {"type": "string", "enum": ["b"]}]
        },
        True,
    ),
    (
        lambda r: {"anyOf": [{"type": "integer", "enum": ["a"]}, {"type": "boolean", "const": 1}]},
        False,
    ),
    (
        lambda r: {
            "oneOf": [{"type": "integer", "enum": ["1"]}, {"type": "string", "enum": ["x"]}]
        },
        True,
    ),
    (lambda r: {"allOf": [{"type": "integer"}, {"enum": ["1", 1, "one"]}]}, True),
    (lambda r: {"allOf": [{"type": "string"}, {"enum": [1, 2]}]}, False),
    (
        lambda r: {"type": "string", "enum": ["a", "b"], "anyOf": [{"const": "b"}, {"const": 3}]},
        True,
    ),
    (lambda r: {"type": "array", "items": {"type": "integer", "enum": ["1", "2"]}}, True),
    (
        lambda r: {"type": "array", "minItems": 1, "items": {"type": "integer", "enum": ["1"]}},
        False,
    ),
    (
        lambda r: {
            "type": "array",
            "prefixItems": [{"type": "string", "enum": ["a"]}, {"type": "integer", "enum": ["b"]}],
        },
        True,
    ),
    (
        lambda r: {
            "type": "object",
            "properties": {"code": {"type": "integer", "enum": ["404", 500]}},
            "required": ["code"],
        },
        True,
    ),
    (
        lambda r: {
            "type": "object",
            "properties": {"flag": {"type": "boolean", "enum": ["yes", "no"]}},
            "required": ["flag"],
        },
        False,
    ),
    (
        lambda r: {
            "type": "object",
            "properties": {"flag": {"type": "boolean", "enum": ["yes", "no"]}},
            "additionalProperties": {"type": "integer", "enum": ["x"]},
        },
        True,
    ),
]

DEFS: Schema = {
    "Level": {"type": "string", "enum": ["low", "high", 3]},
    "Count": {"type": "integer", "enum": ["one", "two"]},
}


def contradiction(rng: random.Random, fits: bool | None = None) -> tuple[Schema, bool]:
    """One contradictory property schema (one that some value fits, if ``fits``; none,
    if not ``fits``) and whether a value fits it."""
    pool = [(m, f) for m, f in SHAPES if fits is None or f == fits]
    maker, ok = rng.choice(pool)
    return maker(rng), ok


def contradictory_object(rng: random.Random, depth: int = 0, *, size: int | None = None) -> Schema:
    """An object schema mixing normal and contradictory properties; only those some
    value fits are ever required. ``$defs`` are added at the top (depth 0)."""
    count = rng.randint(1, 5) if size is None else size
    props: dict[str, Schema] = {}
    required: list[str] = []
    for i in range(count):
        roll = rng.random()
        if roll < 0.45:
            name = rng.choice(sorted(SCALARS))
            schema, fits = SCALARS[name](rng), True
        elif roll < 0.9 or depth >= 2:
            name = f"c{i}"
            schema, fits = contradiction(rng)
        else:
            name = f"nested{i}"
            schema, fits = contradictory_object(rng, depth + 1, size=rng.randint(1, 3)), True
        props[name] = schema
        if fits and rng.random() < 0.5:
            required.append(name)
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    if rng.random() < 0.3:
        out["additionalProperties"] = False
    if depth == 0:
        out["$defs"] = copy.deepcopy(DEFS)
    return out


def with_unsatisfiable_required(
    rng: random.Random, schema: Schema, *, nested: bool | None = None
) -> tuple[Schema, str]:
    """``schema`` (an object) with one more property, required, that no value fits,
    inside a required nested object if ``nested`` (None: either); and its path."""
    bad, _ = contradiction(rng, fits=False)
    out = copy.deepcopy(schema)
    if nested or (nested is None and rng.random() < 0.5):
        out["properties"]["holder"] = {
            "type": "object",
            "properties": {"bad": bad},
            "required": ["bad"],
        }
        out["required"] = [*out.get("required", []), "holder"]
        return out, "holder.bad"
    out["properties"]["bad"] = bad
    out["required"] = [*out.get("required", []), "bad"]
    return out, "bad"


def contradictory_tool_set(rng: random.Random, *, max_tools: int = 4) -> list[FunctionTool]:
    """1 to ``max_tools`` tools whose parameters hold contradictions some value of
    every required parameter fits."""
    pairs = rng.sample([(v, n) for v in VERBS for n in NOUNS], rng.randint(1, max_tools))
    return [
        FunctionTool(name=f"{v}_{n}", parameters=contradictory_object(rng), description=f"{v} {n}")
        for v, n in pairs
    ]
