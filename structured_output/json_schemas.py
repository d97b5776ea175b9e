"""JSON schemas as users write them, rewritten into what xgrammar enforces exactly.

`normalize_schema` walks a schema at every depth (properties, items, prefixItems,
anyOf/oneOf/allOf branches, ``$defs`` through ``$ref``, additionalProperties) and
returns a schema whose every node xgrammar reads as a whole (see `schema_keywords`):

- ``allOf`` and ``$ref`` with keywords beside it are merged into one node; keywords
  beside ``anyOf``/``oneOf`` are merged into each branch;
- ``enum``/``const`` keep only the members that meet the node's other keywords (a
  ``"type": "integer"`` with ``"enum": ["1", "2", "dontcare"]`` keeps none);
- a node that admits no value is left out where the schema allows (an optional
  property, an anyOf branch, the items after a prefix) and otherwise makes the whole
  schema fail with `SchemaError`, naming the required property's path;
- a keyword that cannot be enforced is refused with `SchemaError` naming it and where
  it is, or (``ignore_unsupported``) left out and listed in ``ignored``.

Every value the result admits is valid against the schema as given. `normalize_spec`
applies this to a spec's JSON schema, or to every JSON schema inside a structural tag.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .schema_keywords import ANNOTATIONS, IGNORE_OPTION, REFUSED, SchemaError
from .specs import GrammarSpec, SpecKind

Schema = Any
_MAX_DEPTH = 64
_MAX_BRANCHES = 64
_PREVIEW = 5


@dataclass(frozen=True, slots=True)
class NormalizedSchema:
    schema: Schema
    #: refused keywords left out (``ignore_unsupported``), as "keyword at 'path' (why)"
    ignored: tuple[str, ...] = ()
    #: data paths of optional properties left out because no value fits them
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NormalizedSpec:
    spec: GrammarSpec
    ignored: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unsat:
    """A node that admits no value: why, and the data path of the innermost required
    property that made it so ("" for the node itself)."""

    reason: str
    path: str = ""


def normalize_schema(
    schema: Schema,
    *,
    ignore_unsupported: bool = False,
    subject: str = "the schema",
    filtered: bool = False,
) -> NormalizedSchema:
    """``schema`` rewritten as described above. ``subject`` begins every error message
    (``"tool 'get_weather'"``, ``"response_format schema"``). ``filtered``: the schema
    sits in a structural tag's json_schema with ``excludes``, where xgrammar drops the
    length bounds of strings (so they are refused there)."""
    n = Normalizer(schema, ignore_unsupported, subject, filtered)
    out = n.norm(schema, "")
    if isinstance(out, Unsat):
        if out.path:
            raise SchemaError(
                f"{subject}: the required property '{out.path}' admits no value: {out.reason}"
            )
        raise SchemaError(f"{subject} admits no value: {out.reason}")
    if n.defs:
        out = {**out, "$defs": {name: body for name, body in n.defs.items()}}
    return NormalizedSchema(out, tuple(n.ignored), tuple(n.dropped))


def normalize_spec(spec: GrammarSpec) -> NormalizedSpec:
    """``spec`` with its JSON schema normalized (a structural tag: every JSON schema in
    it); other kinds unchanged. Raises `SchemaError`."""
    if spec.kind == SpecKind.JSON_SCHEMA:
        r = normalize_schema(
            json.loads(spec.value),
            ignore_unsupported=spec.ignore_unsupported,
            subject="response_format schema",
        )
        return NormalizedSpec(replace(spec, value=json.dumps(r.schema)), r.ignored, r.dropped)
    if spec.kind == SpecKind.STRUCTURAL_TAG:
        ignored: list[str] = []
        dropped: list[str] = []

        def fix(schema: Schema, where: str, filtered: bool) -> Schema:
            r = normalize_schema(
                schema,
                ignore_unsupported=spec.ignore_unsupported,
                subject=f"structural_tag json_schema at {where}",
                filtered=filtered,
            )
            ignored.extend(f"{where}: {x}" for x in r.ignored)
            dropped.extend(f"{where}: {x}" for x in r.dropped)
            return r.schema

        tag = _map_tag_schemas(json.loads(spec.value), fix, "")
        return NormalizedSpec(replace(spec, value=json.dumps(tag)), tuple(ignored), tuple(dropped))
    return NormalizedSpec(spec)


_SCHEMA_FORMATS = ("json_schema", "qwen_xml_parameter")


def _map_tag_schemas(node: Any, fix: Callable[[Schema, str, bool], Schema], where: str) -> Any:
    if isinstance(node, list):
        return [_map_tag_schemas(x, fix, f"{where}[{i}]") for i, x in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "json_schema" and node.get("type") in _SCHEMA_FORMATS:
            out[k] = fix(v, where, bool(node.get("excludes")))
        else:
            out[k] = _map_tag_schemas(v, fix, f"{where}.{k}" if where else k)
    return out


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values as JSON Schema sees it: 1 == 1.0, true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def json_key(v: Any) -> Any:
    """A hashable key of a JSON value, equal for values `json_equal` holds equal."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int | float):
        return ("n", v)  # 1 and 1.0 are equal and hash alike
    if isinstance(v, list):
        return ("l", tuple(json_key(x) for x in v))
    if isinstance(v, dict):
        return ("d", frozenset((k, json_key(x)) for k, x in v.items()))
    return (type(v).__name__, v)


def json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def preview(values: list[Any]) -> str:
    shown = ", ".join(json.dumps(v) for v in values[:_PREVIEW])
    return shown + (", ..." if len(values) > _PREVIEW else "")


def join_path(base: str, name: str) -> str:
    return f"{base}.{name}" if base else name


class Normalizer:
    """One schema's walk (holds its root, for ``$ref``, and what it reports)."""

    def __init__(self, root: Schema, ignore: bool, subject: str, filtered: bool = False) -> None:
        self.root = root
        self.ignore = ignore
        self.subject = subject
        self.filtered = filtered
        self.ignored: list[str] = []
        self.dropped: list[str] = []
        #: output definitions by name, and the name of each reference resolved
        self.defs: dict[str, Schema] = {}
        self._ref_names: dict[str, str] = {}
        self._ref_unsat: dict[str, Unsat] = {}
        self._validator: Any = None

    # ----- reporting -------------------------------------------------------------

    def unsupported(self, keyword: str, dpath: str, why: str = "") -> None:
        """A keyword that cannot be enforced: an error, or (ignoring) a note."""
        where = f"'{dpath}'" if dpath else "the root"
        text = f"{keyword} at {where}" + (f" ({why})" if why else "")
        if not self.ignore:
            raise SchemaError(
                f"{self.subject}: {text} cannot be enforced; remove it, or send "
                f"{IGNORE_OPTION}: true to generate without it"
            )
        if text not in self.ignored:
            self.ignored.append(text)

    def invalid(self, dpath: str, what: str) -> SchemaError:
        where = f"'{dpath}'" if dpath else "the root"
        return SchemaError(f"{self.subject}: invalid schema at {where}: {what}")

    def validator(self, schema: Schema) -> Any:
        """A jsonschema validator of ``schema``, resolving references in the root."""
        from jsonschema import Draft202012Validator

        if self._validator is None:
            root = self.root if isinstance(self.root, dict) else {}
            self._validator = Draft202012Validator(root)
        return self._validator.evolve(schema=schema)

    # ----- references --------------------------------------------------------------

    def resolve(self, ref: Any, dpath: str) -> Schema:
        if not isinstance(ref, str):
            raise self.invalid(dpath, f"$ref must be a string, not {ref!r}")
        if not (ref == "#" or ref.startswith("#/")):
            self.unsupported("$ref", dpath, f"{ref!r} is not a local reference ('#/...')")
            return {}
        node = self.root
        for part in filter(None, ref[2:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise self.invalid(dpath, f"$ref {ref!r} points nowhere")
        return node

    def ref(self, ref: str, dpath: str) -> Schema | Unsat:
        """A pure reference: its target normalized once, as an output definition."""
        if ref == "#":
            return {"$ref": "#"}  # the root, normalized as a whole
        name = self._ref_names.get(ref)
        if name is None:
            base = _NAME_CHARS.sub("_", ref.rsplit("/", 1)[-1]) or "def"
            name = base
            k = 1
            while name in self.defs:
                k += 1
                name = f"{base}_{k}"
            self._ref_names[ref] = name
            self.defs[name] = {}  # in progress: a recursive reference assumes a value fits
            body = self.norm(self.resolve(ref, dpath), dpath)
            if isinstance(body, Unsat):
                self._ref_unsat[ref] = body
                del self.defs[name]
            else:
                self.defs[name] = body
        if ref in self._ref_unsat:
            return self._ref_unsat[ref]
        return {"$ref": f"#/$defs/{name}"}

    # ----- flattening: allOf and $ref beside other keywords merged ---------------------

    def flatten(self, node: Schema, dpath: str, depth: int = 0) -> dict[str, Any] | bool:
        """``node`` as one dict without annotations, ``allOf``, ``const``, or a ``$ref``
        with siblings (False: admits nothing)."""
        if depth > _MAX_DEPTH:
            raise self.invalid(dpath, "allOf/$ref nest too deep (a reference cycle?)")
        if node is True:
            return {}
        if node is False:
            return False
        if not isinstance(node, dict):
            raise self.invalid(dpath, f"a schema must be an object or a boolean, not {node!r}")
        out = {k: v for k, v in node.items() if k not in ANNOTATIONS and k not in _DEF_KEYS}
        if "const" in out:
            const = out.pop("const")
            enum = out.get("enum")
            if enum is None or not isinstance(enum, list):
                out["enum"] = [const]
            else:
                out["enum"] = [v for v in enum if json_equal(v, const)]
        if isinstance(out.get("required"), bool):  # draft 3; read by the parent object
            del out["required"]
        for bound, excl in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            if isinstance(out.get(excl), bool):  # draft 4
                if out.pop(excl) and bound in out:
                    out[excl] = out.pop(bound)
        if "$ref" in out and len(out) > 1:
            target = self.flatten(self.resolve(out.pop("$ref"), dpath), dpath, depth + 1)
            return self.merge(target, self.flatten(out, dpath, depth + 1), dpath, depth + 1)
        if "allOf" in out:
            parts = out.pop("allOf")
            if not isinstance(parts, list):
                raise self.invalid(dpath, "allOf must be a list of schemas")
            acc: dict[str, Any] | bool = self.flatten(out, dpath, depth + 1)
            for p in parts:
                acc = self.merge(acc, self.flatten(p, dpath, depth + 1), dpath, depth + 1)
            return acc
        return out

    def deref(self, node: dict[str, Any] | bool, dpath: str, depth: int) -> dict[str, Any] | bool:
        while isinstance(node, dict) and "$ref" in node:
            depth += 1
            node = self.flatten(self.resolve(node["$ref"], dpath), dpath, depth)
            if depth > _MAX_DEPTH:
                raise self.invalid(dpath, "allOf/$ref nest too deep (a reference cycle?)")
        return node

    def merge(
        self, a: dict[str, Any] | bool, b: dict[str, Any] | bool, dpath: str, depth: int
    ) -> dict[str, Any] | bool:
        """The conjunction of two flattened nodes, as one node."""
        if a is False or b is False:
            return False
        if not a or not b:  # one side admits anything (a reference stays a reference)
            return dict(a or b)
        a, b = self.deref(a, dpath, depth), self.deref(b, dpath, depth)
        if a is False or b is False:
            return False
        assert isinstance(a, dict) and isinstance(b, dict)
        if not a or not b:
            return dict(a or b)
        out = dict(a)
        for k, vb in b.items():
            if k not in out:
                out[k] = vb
            elif not json_equal(out[k], vb):
                merged = self._merge_key(k, out[k], vb, dpath)
                if merged is _DROP:
                    del out[k]
                else:
                    out[k] = merged
        self._cross_properties(out, a, b, dpath)
        return out

    def _merge_key(self, k: str, va: Any, vb: Any, dpath: str) -> Any:
        if k == "type":
            ta, tb = types_of(va), types_of(vb)
            common = [t for t in ta if t in tb]
            common += [t for t in ta if t == "integer" and "number" in tb and t not in common]
            common += [t for t in tb if t == "integer" and "number" in ta and t not in common]
            return common
        if k == "enum":
            if not isinstance(va, list) or not isinstance(vb, list):
                raise self.invalid(dpath, "enum must be a list")
            return [v for v in va if any(json_equal(v, w) for w in vb)]
        if k == "required":
            return list(va) + [x for x in vb if x not in va]
        if k in ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"):
            return max(va, vb)
        if k in ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"):
            return min(va, vb)
        if k == "uniqueItems":
            return bool(va or vb)
        if k == "multipleOf":
            if isinstance(va, int) and isinstance(vb, int) and va > 0 and vb > 0:
                return va * vb // math.gcd(va, vb)
            self.unsupported("multipleOf", dpath, "two different steps in allOf")
            return va
        if k == "format":
            return _DROP  # an annotation; two different ones say nothing together
        if k in ("anyOf", "oneOf"):
            if len(va) * len(vb) > _MAX_BRANCHES:
                self.unsupported("allOf", dpath, f"its {k} branches multiply past {_MAX_BRANCHES}")
                return va
            return [{"allOf": [x, y]} for x in va for y in vb]
        if k in ("properties", "patternProperties"):
            return {
                name: ({"allOf": [va[name], vb[name]]} if name in va and name in vb else s)
                for name, s in {**va, **vb}.items()
            }
        if k == "prefixItems":
            n = max(len(va), len(vb))
            return [
                {"allOf": [x for x in (_at(va, i), _at(vb, i)) if x is not None]} for i in range(n)
            ]
        if k in _SCHEMA_VALUED:
            return {"allOf": [va, vb]}
        if k == "pattern":
            self.unsupported("pattern", dpath, "two different patterns in allOf")
            return va
        return va  # refused keywords are reported where the node is read

    def _cross_properties(
        self, out: dict[str, Any], a: dict[str, Any], b: dict[str, Any], dpath: str
    ) -> None:
        """A property declared on one side only still meets the other side's
        additionalProperties (or unevaluatedProperties); a prefix entry of one side
        beyond the other's prefix meets the other's items."""
        pa, pb = a.get("properties") or {}, b.get("properties") or {}
        if isinstance(pa, dict) and isinstance(pb, dict) and pa.keys() != pb.keys():
            if "patternProperties" in a or "patternProperties" in b:
                self.unsupported("allOf", dpath, "patternProperties beside different properties")
            props = dict(out.get("properties") or {})
            for mine, other in ((pa, b), (pb, a)):
                extra = other.get("additionalProperties", other.get("unevaluatedProperties"))
                if extra is None or extra is True:
                    continue
                for name in mine:
                    if name not in (other.get("properties") or {}):
                        props[name] = {"allOf": [props[name], extra]}
            out["properties"] = props
        la, lb = len(a.get("prefixItems") or ()), len(b.get("prefixItems") or ())
        longer, shorter, start = (a, b, lb) if la > lb else (b, a, la)
        if la != lb and "items" in shorter:
            merged = list(out["prefixItems"])
            for i in range(start, len(merged)):
                merged[i] = {"allOf": [merged[i], shorter["items"]]}
            out["prefixItems"] = merged

    # ----- the walk ------------------------------------------------------------------

    def norm(self, node: Schema, dpath: str) -> Schema | Unsat:
        """``node`` in the form xgrammar enforces exactly, or `Unsat`."""
        from .schema_types import typed

        flat = self.flatten(node, dpath)
        if flat is False:
            return Unsat("its schema is false")
        assert isinstance(flat, dict)
        if "enum" in flat:
            return self._enum(flat, dpath)
        for k in REFUSED:
            if k in flat:
                self.unsupported(k, dpath)
                del flat[k]
        if "$ref" in flat:
            return self.ref(flat["$ref"], dpath)
        if "anyOf" in flat or "oneOf" in flat:
            return self._branches(flat, dpath)
        return typed(self, flat, dpath)

    def _enum(self, node: dict[str, Any], dpath: str) -> Schema | Unsat:
        """Only the members that meet every other keyword (checked with jsonschema, so
        refused keywords beside an enum are enforced too)."""
        from jsonschema.exceptions import SchemaError as InvalidSchema

        values = node["enum"]
        if not isinstance(values, list):
            raise self.invalid(dpath, "enum must be a list")
        rest = {k: v for k, v in node.items() if k != "enum"}
        kept = values
        plain_type = isinstance(rest.get("type"), str | list)
        if set(rest) == {"type"} and plain_type and values:  # the common case, quicker
            types = types_of(rest["type"])
            kept = [v for v in values if _fits_type(v, types)]
        elif rest and values:
            try:
                check = self.validator(rest)
                kept = [v for v in values if check.is_valid(v)]
            except (InvalidSchema, ValueError, TypeError, LookupError) as e:
                raise self.invalid(dpath, f"cannot check its enum values: {e}") from None
        unique: list[Any] = []
        seen: set[Any] = set()
        for v in kept:  # by a hashable key: a 20,000-member enum is common enough
            key = json_key(v)
            if key not in seen:
                seen.add(key)
                unique.append(v)
        if unique:
            return {"enum": unique}
        if not values:
            return Unsat("its enum is empty")
        types = types_of(rest["type"]) if "type" in rest else []
        if types and not any(_fits_type(v, types) for v in values):
            return Unsat(f"none of its enum values ({preview(values)}) is of type {_or(types)}")
        others = ", ".join(sorted(rest))
        return Unsat(f"none of its enum values ({preview(values)}) meets its {others}")

    def _branches(self, node: dict[str, Any], dpath: str) -> Schema | Unsat:
        from .schema_oneof import disjoint

        rest = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
        kind = "anyOf" if "anyOf" in node else "oneOf"
        if kind == "anyOf" and "oneOf" in node:
            rest["oneOf"] = node["oneOf"]
        branches = node[kind]
        if not isinstance(branches, list) or not branches:
            raise self.invalid(dpath, f"{kind} must be a non-empty list of schemas")
        results = []
        for b in branches:
            merged = self.merge(self.flatten(b, dpath), self.flatten(rest, dpath), dpath, 0)
            results.append(self.norm(merged, dpath))
        kept = [r for r in results if not isinstance(r, Unsat)]
        if not kept:
            first = results[0]
            assert isinstance(first, Unsat)
            return Unsat(f"no {kind} branch admits a value; the first: {first.reason}", first.path)
        if kind == "oneOf" and len(kept) > 1 and not disjoint(self, kept):
            self.unsupported("oneOf", dpath, "its branches may overlap, and only one may match")
        return kept[0] if len(kept) == 1 else {"anyOf": kept}

    def target(self, node: Schema) -> Schema:
        """A normalized node with its reference followed (to the output definition)."""
        for _ in range(_MAX_DEPTH):
            if not (isinstance(node, dict) and "$ref" in node):
                return node
            ref = node["$ref"]
            if ref == "#":
                return {}
            node = self.defs.get(ref.rsplit("/", 1)[-1], {})
        return {}


class _Drop:
    pass


_DROP = _Drop()
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
_DEF_KEYS = ("$defs", "definitions")
_SCHEMA_VALUED = (
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "additionalItems",
    "unevaluatedItems",
    "propertyNames",
)
TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


def _at(items: list[Any], i: int) -> Any:
    return items[i] if i < len(items) else None


def types_of(value: Any) -> list[str]:
    """A ``type`` keyword's names, as a list."""
    return [value] if isinstance(value, str) else list(value)


def _fits_type(v: Any, types: list[str]) -> bool:
    t = json_type(v)
    return t in types or (t == "integer" and "number" in types)


def _or(types: list[str]) -> str:
    return " or ".join(types)
