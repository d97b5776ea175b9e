"""Which JSON Schema keywords the grammar compiler enforces, and how.

xgrammar 0.2.9 reads a schema node by its first keyword among ``$ref``, ``const``,
``enum``, ``anyOf``, ``oneOf``, ``allOf`` and ``type`` and ignores that keyword's
siblings; it turns ``allOf`` of two or more parts into "any value", falls back to
``anyOf`` for a ``oneOf`` it cannot prove exclusive, and logs a warning (nothing more)
for ``not``, ``if``/``then``/``else``, ``dependentRequired``, ``dependentSchemas``,
``uniqueItems`` and ``contains``. `json_schemas.normalize_schema` rewrites every schema
into a form it reads exactly; this module holds the table of what that form enforces
(the README's "JSON Schema keywords" section is this table) and the error raised for
a schema it cannot enforce.
"""

from __future__ import annotations

from .specs import GrammarError

#: keyword -> how it is enforced (each one is exercised by tests/structured_output/
#: test_schema_keywords.py through the engine, outputs checked with jsonschema)
ENFORCED: dict[str, str] = {
    "type": "a type name or a list of them",
    "enum": "only the members that also meet the schema's other keywords are offered",
    "const": "as an enum of one value",
    "properties": "in the order declared",
    "required": "also a draft-3 `required: true` inside a property",
    "additionalProperties": "boolean or schema; absent means no undeclared properties",
    "patternProperties": "also applied to declared properties whose names match",
    "propertyNames": "also applied to declared properties",
    "minProperties": "",
    "maxProperties": "",
    "unevaluatedProperties": "read as additionalProperties once allOf/anyOf are merged",
    "items": "schema, boolean, or the draft-4..7 list form (with additionalItems)",
    "prefixItems": "",
    "additionalItems": "with the list form of items",
    "unevaluatedItems": "read as items when items is absent",
    "minItems": "",
    "maxItems": "",
    "uniqueItems": "when at most one item fits, or the items are a set of at most 6 values "
    "(then offered in the set's order); otherwise refused",
    "minimum": "",
    "maximum": "",
    "exclusiveMinimum": "also the draft-4 boolean form",
    "exclusiveMaximum": "also the draft-4 boolean form",
    "multipleOf": "integers: a whole step up to 1024 with no bound or both bounds at most "
    "10000 apart; a whole step on a number makes it an integer; otherwise refused",
    "minLength": "counted in characters; beside a pattern, only if the pattern implies it; "
    "refused in a structural tag's json_schema with excludes",
    "maxLength": "counted in characters; beside a pattern, only if the pattern implies it; "
    "refused in a structural tag's json_schema with excludes",
    "pattern": "the whole string matches; lookarounds, backreferences, \\b, \\A, \\Z, "
    "\\p{..}, inline flags and possessive quantifiers are refused",
    "anyOf": "keywords beside it are merged into each branch",
    "oneOf": "when its branches cannot overlap (types, values, or a required property "
    "whose values differ); otherwise refused",
    "allOf": "merged into one schema; parts that cannot merge are refused",
    "$ref": "local references (`#`, `#/...`; others refused); keywords beside it are merged in",
    "$defs": "",
    "definitions": "",
}

#: keywords refused (named in the error, with where they are), or left out with
#: ``ignore_unsupported_keywords``
REFUSED: tuple[str, ...] = (
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "contains",
    "minContains",
    "maxContains",
    "$dynamicRef",
    "$recursiveRef",
)

#: keywords that never change whether a value is valid (JSON Schema's annotations)
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
        "$schema",
        "$id",
        "$anchor",
        "$dynamicAnchor",
        "$recursiveAnchor",
        "$vocabulary",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    }
)

#: ``format`` is an annotation (JSON Schema 2020-12's default); strings with one of
#: these names are also shaped by xgrammar's pattern for it, when they have no
#: ``pattern`` or length bounds of their own
SHAPED_FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)

#: the option that leaves refused keywords out instead (request field and wire field)
IGNORE_OPTION = "ignore_unsupported_keywords"


class SchemaError(GrammarError):
    """A schema the grammar cannot enforce, or that admits no value; the message names
    the keyword or property and where it is."""


def readme_table() -> str:
    """The README's table of keywords, from the dictionaries above."""
    rows = ["| keyword | enforced | how |", "|---|---|---|"]
    rows += [f"| `{k}` | yes | {v} |" for k, v in ENFORCED.items()]
    rows += [
        f"| `{k}` | refused | named in the error; `{IGNORE_OPTION}` leaves it out |"
        for k in REFUSED
    ]
    rows.append("| `format` | annotation | shaped for " + ", ".join(sorted(SHAPED_FORMATS)) + " |")
    rows.append(
        "| "
        + ", ".join(f"`{k}`" for k in sorted(ANNOTATIONS))
        + " | annotation | no effect on validity |"
    )
    return "\n".join(rows)
