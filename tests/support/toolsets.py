"""Seeded random tool sets that look like real APIs.

``random_tool_set(rng)`` gives 1-8 tools with API-like names and descriptions; their
parameters mix strings (plain, enum, pattern, format, length-bounded, nullable),
numbers and integers with ranges, booleans, arrays, nested objects, optional
parameters, and now and then a ``$ref`` to a shared definition. Everything is drawn
from ``rng``, so a seed reproduces a tool set exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from frontend.tool_formats import FunctionTool

Schema = dict[str, Any]

VERBS = [
    "get", "list", "create", "update", "delete", "search", "send", "fetch", "book",
    "cancel", "convert", "calculate", "schedule", "translate", "upload", "lookup",
]  # fmt: skip
NOUNS = [
    "weather", "time", "flights", "hotel", "email", "issue", "file", "user", "order",
    "invoice", "event", "stock_price", "exchange_rate", "route", "reminder", "document",
    "contact", "ticket", "playlist", "recipe",
]  # fmt: skip


def _text(description: str) -> Callable[[random.Random], Schema]:
    return lambda rng: {"type": "string", "description": description}


def _enum(values: list[str], description: str) -> Callable[[random.Random], Schema]:
    return lambda rng: {"type": "string", "enum": values, "description": description}


def _bounded(
    kind: str, lo: float | None, hi: float | None, description: str
) -> Callable[[random.Random], Schema]:
    """An ``integer`` or ``number`` schema with the bounds that are not None."""

    def make(rng: random.Random) -> Schema:
        s: Schema = {"type": kind, "description": description}
        if lo is not None:
            s["minimum"] = lo
        if hi is not None:
            s["maximum"] = hi
        return s

    return make


def _boolean(description: str) -> Callable[[random.Random], Schema]:
    return lambda rng: {"type": "boolean", "description": description}


# name -> schema maker; the pool parameters are drawn from
SCALARS: dict[str, Callable[[random.Random], Schema]] = {
    "city": _text("City name, e.g. Paris"),
    "query": _text("Free-text search query"),
    # (xgrammar enforces maxLength only up to 32 inside filtered JSON strings; see
    # grammar.MAX_ENFORCED_LENGTH)
    "title": lambda rng: {"type": "string", "maxLength": 32, "description": "Short title"},
    "body": _text("Message body"),
    "path": _text("File path relative to the workspace"),
    "user_id": _text("Opaque user identifier"),
    "email": lambda rng: {"type": "string", "format": "email", "description": "Email address"},
    "date": lambda rng: {"type": "string", "format": "date", "description": "ISO date"},
    "currency": lambda rng: {
        "type": "string",
        "pattern": "^[A-Z]{3}$",
        "description": "ISO 4217 code",
    },
    "zip_code": lambda rng: {"type": "string", "pattern": "^[0-9]{5}$"},
    "language": _enum(["en", "fr", "de", "es", "zh", "ja"], "Target language"),
    "unit": _enum(["celsius", "fahrenheit"], "Temperature unit"),
    "sort_order": _enum(["asc", "desc"], "Sort direction"),
    "priority": _enum(["low", "medium", "high", "urgent"], "Priority"),
    "status": _enum(["open", "closed", "all"], "Status filter"),
    "mode": _enum(["driving", "walking", "transit", "cycling"], "Travel mode"),
    "note": lambda rng: {"type": ["string", "null"], "description": "Optional note"},
    "limit": _bounded("integer", 1, 100, "Maximum number of results"),
    "page": _bounded("integer", 1, None, "Page number, from 1"),
    "year": _bounded("integer", 1900, 2100, "Calendar year"),
    "days": _bounded("integer", 0, 30, "Number of days ahead"),
    "quantity": _bounded("integer", None, None, "How many"),
    "amount": _bounded("number", 0, None, "Amount of money"),
    "latitude": _bounded("number", -90, 90, "Latitude in degrees"),
    "longitude": _bounded("number", -180, 180, "Longitude in degrees"),
    "temperature": _bounded("number", None, None, "Temperature"),
    "include_archived": _boolean("Include archived items"),
    "verbose": _boolean("Return extra detail"),
    "dry_run": _boolean("Validate without applying"),
    "notify": _boolean("Send a notification"),
}


def _array(rng: random.Random, depth: int) -> Schema:
    items = rng.choice(["string", "integer", "enum", "object"] if depth < 2 else ["string"])
    if items == "string":
        item: Schema = {"type": "string"}
    elif items == "integer":
        item = {"type": "integer", "minimum": 0}
    elif items == "enum":
        item = {"type": "string", "enum": ["red", "green", "blue"]}
    else:
        item = _object(rng, depth + 1, size=rng.randint(1, 3))
    s: Schema = {"type": "array", "items": item, "description": "A list"}
    if rng.random() < 0.5:
        s["maxItems"] = rng.randint(1, 4)
    if rng.random() < 0.3:
        s["minItems"] = 1
    return s


def _object(rng: random.Random, depth: int, size: int) -> Schema:
    names = rng.sample(sorted(SCALARS), size)
    props: dict[str, Schema] = {}
    for n in names:
        props[n] = SCALARS[n](rng)
    if depth < 2 and rng.random() < 0.2:
        props["items"] = _array(rng, depth + 1)
    required = [n for n in props if rng.random() < 0.5]
    s: Schema = {"type": "object", "properties": props}
    if required:
        s["required"] = required
    if rng.random() < 0.5:
        s["additionalProperties"] = False
    return s


def random_parameters(rng: random.Random) -> Schema:
    """The parameter schema of one tool: 0-6 parameters, some required, perhaps nested
    objects and arrays, perhaps a ``$ref`` into ``$defs``."""
    n = rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 5, 6])
    props: dict[str, Schema] = {}
    defs: dict[str, Schema] = {}
    for name in rng.sample(sorted(SCALARS), n):
        props[name] = SCALARS[name](rng)
    roll = rng.random()
    if n and roll < 0.25:
        props["filters"] = _object(rng, 1, size=rng.randint(1, 3))
    elif n and roll < 0.45:
        props["tags"] = _array(rng, 1)
    elif n and roll < 0.55:
        defs["Location"] = {
            "type": "object",
            "properties": {
                "latitude": SCALARS["latitude"](rng),
                "longitude": SCALARS["longitude"](rng),
            },
            "required": ["latitude", "longitude"],
        }
        props["location"] = {"$ref": "#/$defs/Location"}
    required = [k for k in props if rng.random() < 0.6]
    schema: Schema = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    if defs:
        schema["$defs"] = defs
    if rng.random() < 0.3:
        schema["additionalProperties"] = False
    return schema


def random_tool_set(rng: random.Random, *, max_tools: int = 8) -> list[FunctionTool]:
    """1 to ``max_tools`` tools with distinct names."""
    count = rng.randint(1, max_tools)
    pairs = rng.sample([(v, n) for v in VERBS for n in NOUNS], count)
    tools = []
    for verb, noun in pairs:
        name = f"{verb}_{noun}"
        tools.append(
            FunctionTool(
                name=name,
                parameters=random_parameters(rng),
                description=f"{verb.capitalize()} the {noun.replace('_', ' ')}.",
            )
        )
    return tools


def tool_sets(seed: int, count: int, *, max_tools: int = 8) -> Iterator[list[FunctionTool]]:
    """``count`` tool sets from one seed."""
    rng = random.Random(seed)
    for _ in range(count):
        yield random_tool_set(rng, max_tools=max_tools)


def string_tool_set(rng: random.Random, *, max_tools: int = 3) -> list[FunctionTool]:
    """1 to ``max_tools`` tools whose parameters are free strings (required or
    optional, one now and then in a nested object or an array): what a model writes
    there is any text it likes."""
    pairs = rng.sample([(v, n) for v in VERBS for n in NOUNS], rng.randint(1, max_tools))
    tools = []
    for verb, noun in pairs:
        names = rng.sample(["text", "query", "note", "title", "body", "city", "path"], 3)
        props: Schema = {n: {"type": "string"} for n in names[: rng.randint(1, 3)]}
        if rng.random() < 0.3:
            props["detail"] = {"type": "object", "properties": {"memo": {"type": "string"}}}
        if rng.random() < 0.3:
            props["tags"] = {"type": "array", "items": {"type": "string"}, "maxItems": 3}
        required = [n for n in props if rng.random() < 0.7]
        params: Schema = {"type": "object", "properties": props, "required": required}
        tools.append(FunctionTool(name=f"{verb}_{noun}", parameters=params))
    return tools
