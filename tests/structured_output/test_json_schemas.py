"""Schemas normalized for the grammar compiler (structured_output/json_schemas.py),
checked without generating: what is kept, left out or refused, and what the errors
name. Generation through the engine is in test_schema_engine.py and
test_schema_keywords.py."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from frontend.tool_formats import FunctionTool, ToolFormatError
from frontend.tool_formats.schemas import normalize_tools
from structured_output import GrammarSpec
from structured_output.json_schemas import json_equal, json_key, normalize_schema, normalize_spec
from structured_output.schema_keywords import REFUSED, SchemaError
from structured_output.schema_regex import (
    PYTHON_SPACE,
    WRITABLE,
    PatternError,
    python_class,
    rewrite_pattern,
)
from tests.support.contradictions import (
    DEFS,
    SHAPES,
    contradictory_object,
    with_unsatisfiable_required,
)


def _wrap(prop, required: bool) -> dict:
    root = {"type": "object", "properties": {"x": prop}, "$defs": DEFS}
    if required:
        root["required"] = ["x"]
    return root


@pytest.mark.parametrize("index", range(len(SHAPES)))
def test_each_contradiction_is_kept_left_out_or_refused(index):
    make, fits = SHAPES[index]
    prop = make(random.Random(index))
    optional = normalize_schema(_wrap(prop, required=False))
    assert ("x" in optional.dropped) == (not fits)
    assert ("x" in optional.schema.get("properties", {})) == fits
    if fits:
        kept = normalize_schema(_wrap(prop, required=True)).schema["properties"]["x"]
        for value in kept.get("enum", []):  # every member offered is valid as given
            jsonschema.validate({"x": value}, _wrap(prop, required=True))
    else:
        with pytest.raises(SchemaError, match=r"the required property 'x[.\[]?.*' admits no value"):
            normalize_schema(_wrap(prop, required=True))


def test_the_real_world_cases_of_the_issue():
    schema = {
        "type": "object",
        "properties": {
            "stars": {"type": "integer", "enum": ["1", "2", "dontcare"]},
            "parking": {"type": "boolean", "enum": ["True", "False"]},
            "amenities": {"type": "array", "enum": ["wifi", "pool"]},
            "area": {"type": "string", "enum": ["north", "south"]},
        },
        "required": ["area"],
    }
    out = normalize_schema(schema)
    assert out.schema["properties"] == {"area": {"enum": ["north", "south"]}}
    assert out.schema["additionalProperties"] is False  # nor can they come back as extras
    assert out.dropped == ("stars", "parking", "amenities")
    schema["required"] = ["area", "stars"]
    with pytest.raises(SchemaError) as e:
        normalize_schema(schema, subject="response_format schema")
    assert str(e.value) == (
        "response_format schema: the required property 'stars' admits no value: none of "
        'its enum values ("1", "2", "dontcare") is of type integer'
    )


def test_tool_errors_name_the_tool_and_the_property():
    rng = random.Random(5)
    for _ in range(20):
        params, path = with_unsatisfiable_required(rng, contradictory_object(rng))
        tools = [
            FunctionTool("get_weather", {"type": "object", "properties": {}}),
            FunctionTool("book_hotel", params),
        ]
        with pytest.raises(ToolFormatError) as e:
            normalize_tools(tools)
        assert str(e.value).startswith(f"tool 'book_hotel': the required property '{path}")
        assert "admits no value" in str(e.value)


def test_tools_keep_what_fits_and_say_what_they_left_out():
    tools = [
        FunctionTool(
            "find",
            {
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "enum": ["1", 2]},
                    "x": {"type": "integer", "enum": ["a"]},
                    "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                },
                "required": ["n"],
            },
        ),
        FunctionTool("free", None),
    ]
    with pytest.raises(ToolFormatError, match=r"tool 'find': uniqueItems at 'tags'"):
        normalize_tools(tools)
    out = normalize_tools(tools, ignore_unsupported=True)
    assert out.tools[0].parameters["properties"] == {
        "n": {"enum": [2]},
        "tags": {"type": "array", "items": {"type": "string"}},
    }
    assert out.tools[1] is tools[1]
    assert out.dropped == ("tool 'find': x",)
    assert out.ignored == (
        "tool 'find': uniqueItems at 'tags' (its items are not a set of at most 6 values)",
    )


#: a value for each refused keyword, on a string property
REFUSED_VALUES = {
    "not": {"const": "x"},
    "if": {"minLength": 2},
    "then": {"maxLength": 3},
    "else": {"maxLength": 1},
    "dependentRequired": {"a": ["b"]},
    "dependentSchemas": {"a": {"required": ["b"]}},
    "dependencies": {"a": ["b"]},
    "contains": {"const": "x"},
    "minContains": 2,
    "maxContains": 1,
    "$dynamicRef": "#meta",
    "$recursiveRef": "#",
}


def test_every_refused_keyword_has_a_case():
    assert set(REFUSED_VALUES) == set(REFUSED)


@pytest.mark.parametrize("keyword", sorted(REFUSED_VALUES))
def test_refused_keywords_are_refused_or_left_out_on_request(keyword):
    prop = {"type": "string", keyword: REFUSED_VALUES[keyword]}
    schema = {"type": "object", "properties": {"deep": {"type": "array", "items": prop}}}
    with pytest.raises(SchemaError, match=rf"^tool 'f': {re.escape(keyword)} at 'deep\[\]'"):
        normalize_schema(schema, subject="tool 'f'")
    out = normalize_schema(schema, ignore_unsupported=True)
    assert out.ignored == (f"{keyword} at 'deep[]'",)
    assert keyword not in json.dumps(out.schema)


def test_keywords_beside_an_enum_are_enforced_by_filtering_it():
    schema = {"enum": [["a", "a"], ["a", "b"], "x"], "uniqueItems": True, "not": {"const": "x"}}
    assert normalize_schema(schema).schema == {"enum": [["a", "b"]]}


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"^(?=.*\d)[a-z\d]{4}$", "a lookahead"),
        (r"^(?!x)[a-z]{3}$", "a lookahead"),
        (r"(?<=a)b", "a lookbehind"),
        (r"^(a)\1$", "a backreference"),
        (r"\bfoo\b", r"the word boundary \b"),
        (r"^\Aab", r"the anchor \A"),
        (r"^ab\Z", r"the anchor \Z"),
        (r"^\p{L}+$", r"the Unicode property class \p"),
        (r"^(?i)abc$", "an inline flag group"),
        (r"^a++$", "a possessive quantifier"),
        (r"^a(^b)$", "the anchor ^ somewhere other than the start"),
        (r'^"[a-z]+"$', "quotes, backslashes or control characters"),
        (r"^\t$", "quotes, backslashes or control characters"),
    ],
)
def test_patterns_outside_the_exact_subset_are_refused(pattern, construct):
    with pytest.raises(PatternError, match=re.escape(construct)):
        rewrite_pattern(pattern)
    with pytest.raises(SchemaError, match=r"pattern at 'code' \("):
        normalize_schema(
            {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}}
        )


#: patterns as tool schemas write them, several with classes whose meaning differs
#: between ECMA-262 and Python's re
PATTERNS = [
    r"^[A-Z]{3}$",
    r"^\d{5}(-\d{4})?$",
    r"^[^@]+@[^@]+\.[^@]+$",
    r"^\S+$",
    r"^\w+$",
    r"^\W\D\S$",
    r"^[^\d\s]{2,4}$",
    r"^https?://[\w.-]+(/\S*)?$",
    r"[0-9]+",
    r"^(red|green|blue)$",
    r"^.{1,8}$",
    r"^[^a-z]*?x$",
    r'^(a|")b$',
    r"^\+?[1-9]\d{1,14}$",
]
#: characters the sampler prefers inside a class: ASCII, and non-ASCII ones on which
#: the two regex dialects disagree (digits and letters of other scripts, Unicode
#: spaces, U+0085)
PROBE = [ord(c) for c in map(chr, range(0x7F))] + [
    ord(c) for c in "\x85\xa0é٣߀०\u1680\u2000\u2028\u2029\u202f\u3000\ufeffЖ字😀\ud7ff\ue000"
]


def _sample(tree, rng: random.Random) -> str:
    """A random text matching a parsed regex (Python's own parser: `re._parser`), of
    the constructs `rewrite_pattern` writes."""
    out = []
    for op, arg in tree:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "IN":
            ranges = [(a, a) if str(k) == "LITERAL" else a for k, a in arg]
            probes = [c for c in PROBE if any(lo <= c <= hi for lo, hi in ranges)]
            if probes and rng.random() < 0.7:
                out.append(chr(rng.choice(probes)))
            else:
                lo, hi = rng.choice(ranges)
                out.append(chr(rng.randint(lo, hi)))
        elif name in ("MAX_REPEAT", "MIN_REPEAT"):
            low, high, sub = arg
            count = rng.randint(low, min(high, low + 4))
            out += [_sample(sub, rng) for _ in range(count)]
        elif name == "SUBPATTERN":
            out.append(_sample(arg[-1], rng))
        elif name == "BRANCH":
            out.append(_sample(rng.choice(arg[1]), rng))
        elif name != "AT":
            raise AssertionError(f"unexpected regex construct {name}")
    return "".join(out)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_rewritten_patterns_admit_only_what_the_original_matches(pattern):
    from re import _parser

    rewritten = rewrite_pattern(pattern)
    tree = _parser.parse(rewritten)
    rng = random.Random(pattern)
    for _ in range(300):
        text = _sample(tree, rng)
        assert re.fullmatch(rewritten, text)
        assert re.search(pattern, text), (pattern, rewritten, text)
        assert all(_writable(ord(c)) for c in text), text  # nothing JSON must escape


def _writable(code: int) -> bool:
    return any(lo <= code <= hi for lo, hi in WRITABLE)


def test_normalizing_twice_changes_nothing():
    rng = random.Random(11)
    for _ in range(100):
        once = normalize_schema(contradictory_object(rng)).schema
        assert normalize_schema(once).schema == once


def test_structural_tags_have_their_schemas_normalized():
    fmt = {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": "<x>"},
            {
                "type": "json_schema",
                "json_schema": _wrap({"type": "integer", "enum": ["1", 2]}, required=True),
            },
        ],
    }
    spec = GrammarSpec.of("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}))
    out = json.loads(normalize_spec(spec).spec.value)
    assert out["format"]["elements"][1]["json_schema"]["properties"]["x"] == {"enum": [2]}
    fmt["elements"][1]["json_schema"] = _wrap({"type": "integer", "enum": ["1"]}, required=True)
    bad = GrammarSpec.of("structural_tag", json.dumps(fmt))
    with pytest.raises(
        SchemaError,
        match=r"^structural_tag json_schema at elements\[1\]: the required property 'x'",
    ):
        normalize_spec(bad)


def test_the_written_down_python_space_class_is_pythons():
    assert PYTHON_SPACE == python_class("s")


def test_lengths_beside_a_pattern_are_kept_only_where_the_pattern_implies_them():
    implied = {"type": "string", "pattern": "^[A-Z]{3}$", "minLength": 3, "maxLength": 3}
    assert normalize_schema(implied).schema == {"type": "string", "pattern": "^[A-Z]{3}$"}
    for key, value in (("minLength", 2), ("maxLength", 9)):
        loose = {"type": "string", "pattern": "^[a-z]+$", key: value}
        with pytest.raises(SchemaError, match=f"^the schema: {key} at the root"):
            normalize_schema(loose)


def test_lengths_in_a_filtered_tag_schema_are_refused():
    fmt = {
        "type": "json_schema",
        "json_schema": {"type": "string", "maxLength": 5},
        "excludes": ["<|"],
    }
    with pytest.raises(SchemaError, match=r"maxLength at the root \(xgrammar drops"):
        normalize_spec(GrammarSpec.of("structural_tag", json.dumps(fmt)))
    del fmt["excludes"]
    normalize_spec(GrammarSpec.of("structural_tag", json.dumps(fmt)))


def test_one_of_is_enforced_only_where_its_branches_cannot_overlap():
    kinds = {
        "$defs": {
            "Cat": {
                "type": "object",
                "properties": {"kind": {"const": "cat"}},
                "required": ["kind"],
            },
            "Dog": {
                "type": "object",
                "properties": {"kind": {"enum": ["dog"]}},
                "required": ["kind"],
            },
        },
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
    }
    for schema in (
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        {"oneOf": [{"enum": [1, 2]}, {"enum": [3, "x"]}]},
        {"oneOf": [{"const": 1}, {"type": "string"}]},
        kinds,
    ):
        assert "anyOf" in normalize_schema(schema).schema, schema
    overlapping = {"oneOf": [{"type": "number"}, {"type": "integer", "minimum": 3}]}
    with pytest.raises(SchemaError, match=r"oneOf at the root \(its branches may overlap"):
        normalize_schema(overlapping)
    out = normalize_schema(overlapping, ignore_unsupported=True)
    assert out.ignored == ("oneOf at the root (its branches may overlap, and only one may match)",)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([0.0, 1.0, 2.5])
    | st.text("ab"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab"), inner, max_size=3),
    max_leaves=8,
)


@given(_JSON, _JSON)
def test_the_enum_dedup_key_agrees_with_json_equality(a, b):
    assert (json_key(a) == json_key(b)) == json_equal(a, b)


def test_an_enum_keeps_its_first_member_of_each_equal_group():
    got = normalize_schema({"enum": [1, 1.0, True, "1", [1], [1.0], {"a": 1}, {"a": 1.0}, 1]})
    assert got.schema == {"enum": [1, True, "1", [1], {"a": 1}]}
