"""The typed half of `json_schemas.normalize_schema`: one node's keywords for each of
its types, in the form xgrammar 0.2.9 enforces exactly (see `schema_keywords`)."""

from __future__ import annotations

import math
import re
from itertools import combinations
from typing import TYPE_CHECKING, Any

from .json_schemas import TYPES, Unsat, join_path, json_equal
from .schema_keywords import SHAPED_FORMATS
from .schema_regex import PatternError, pattern_lengths, rewrite_pattern

if TYPE_CHECKING:
    from .json_schemas import Normalizer, Schema

#: the keywords that make an untyped node one of these types (JSON Schema lets other
#: types through untouched; generating only this type is a subset, so still valid)
_TYPE_KEYWORDS = {
    "object": {
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "unevaluatedProperties",
    },
    "array": {
        "items",
        "prefixItems",
        "additionalItems",
        "unevaluatedItems",
        "minItems",
        "maxItems",
        "uniqueItems",
    },
    "string": {"pattern", "minLength", "maxLength"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}
#: xgrammar's limits on an enforced integer ``multipleOf``
MAX_STEP = 1024
MAX_STEP_RANGE = 10000
#: uniqueItems is enforced over item sets of at most this many values
MAX_UNIQUE_SET = 6
_INT64 = (-(2**63), 2**63 - 1)


def typed(n: Normalizer, node: dict[str, Any], dpath: str) -> Schema | Unsat:
    if "type" in node:
        raw = node["type"]
        types = [raw] if isinstance(raw, str) else raw
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise n.invalid(dpath, "type must be a type name or a list of them")
        unknown = [t for t in types if t not in TYPES]
        if unknown:
            raise n.invalid(dpath, f"unknown type {unknown[0]!r} (JSON types: {', '.join(TYPES)})")
        if not types:
            return Unsat("no type is left (its allOf parts ask for different types)")
    else:
        types = [t for t, keys in _TYPE_KEYWORDS.items() if keys & node.keys()]
        if not types:
            return {}
    types = list(dict.fromkeys(types))
    if "number" in types and "integer" in types:
        types.remove("integer")
    results = [_BY_TYPE[t](n, node, dpath, t) for t in types]
    kept = [r for r in results if not isinstance(r, Unsat)]
    if not kept:
        first = results[0]
        assert isinstance(first, Unsat)
        return first
    return kept[0] if len(kept) == 1 else {"anyOf": kept}


def _plain(n: Normalizer, node: dict[str, Any], dpath: str, kind: str) -> Schema:
    return {"type": kind}


def _count(n: Normalizer, node: dict[str, Any], key: str, dpath: str) -> int | None:
    v = node.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise n.invalid(dpath, f"{key} must be a non-negative integer, not {v!r}")
    return v


def _num(n: Normalizer, node: dict[str, Any], key: str, dpath: str) -> float | int | None:
    v = node.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise n.invalid(dpath, f"{key} must be a finite number, not {v!r}")
    return v


# ----- numbers ------------------------------------------------------------------------


def _number(n: Normalizer, node: dict[str, Any], dpath: str, kind: str) -> Schema | Unsat:
    lo, hi = _num(n, node, "minimum", dpath), _num(n, node, "maximum", dpath)
    xlo, xhi = _num(n, node, "exclusiveMinimum", dpath), _num(n, node, "exclusiveMaximum", dpath)
    step = _num(n, node, "multipleOf", dpath)
    if step is not None and step <= 0:
        raise n.invalid(dpath, f"multipleOf must be above 0, not {step!r}")
    if kind == "number" and step is not None:
        if float(step).is_integer():
            kind = "integer"  # the numbers that are whole multiples of a whole step
        else:
            n.unsupported("multipleOf", dpath, "a fractional step on a number")
            step = None
    if kind == "integer":
        return _integer(n, dpath, lo, hi, xlo, xhi, step)
    lower = _stricter(lo, xlo, max)
    upper = _stricter(hi, xhi, min)
    if lower and upper:
        (a, a_open), (b, b_open) = lower, upper
        if a > b or (a == b and (a_open or b_open)):
            return Unsat(f"its range is empty ({_range(lower, upper)})")
    out: dict[str, Any] = {"type": "number"}
    if lower:
        out["exclusiveMinimum" if lower[1] else "minimum"] = lower[0]
    if upper:
        out["exclusiveMaximum" if upper[1] else "maximum"] = upper[0]
    return out


def _stricter(bound: Any, open_bound: Any, pick: Any) -> tuple[float, bool] | None:
    """(value, exclusive) of the stricter of an inclusive and an exclusive bound."""
    if bound is None and open_bound is None:
        return None
    if open_bound is None:
        return (bound, False)
    if bound is None:
        return (open_bound, True)
    return (open_bound, True) if pick(bound, open_bound) == open_bound else (bound, False)


def _range(lower: tuple[float, bool] | None, upper: tuple[float, bool] | None) -> str:
    left = "(-inf" if lower is None else ("(" if lower[1] else "[") + f"{lower[0]:g}"
    right = "inf)" if upper is None else f"{upper[0]:g}" + (")" if upper[1] else "]")
    return f"{left}, {right}"


def _integer(
    n: Normalizer, dpath: str, lo: Any, hi: Any, xlo: Any, xhi: Any, step: Any
) -> Schema | Unsat:
    lows = [
        math.ceil(lo) if lo is not None else None,
        math.floor(xlo) + 1 if xlo is not None else None,
    ]
    highs = [
        math.floor(hi) if hi is not None else None,
        math.ceil(xhi) - 1 if xhi is not None else None,
    ]
    low = max((x for x in lows if x is not None), default=None)
    high = min((x for x in highs if x is not None), default=None)
    if low is not None and high is not None and low > high:
        return Unsat(f"no integer lies in its range [{low}, {high}]")
    for key, v in (("minimum", low), ("maximum", high)):
        if v is not None and not _INT64[0] <= v <= _INT64[1]:
            n.unsupported(key, dpath, "a bound beyond 64-bit integers")
            low, high = (None, high) if key == "minimum" else (low, None)
    if step is not None:
        if step < 1 and (1 / step).is_integer():
            step = None  # every integer is a multiple of 1/k
        elif not float(step).is_integer():
            n.unsupported("multipleOf", dpath, "a fractional step on an integer")
            step = None
        else:
            step = int(step)
        if step == 1:
            step = None
    if step is not None:
        if step > MAX_STEP:
            n.unsupported("multipleOf", dpath, f"a step over {MAX_STEP}")
            step = None
        elif (low is None) != (high is None):
            n.unsupported("multipleOf", dpath, "a range bounded on one side only")
            step = None
        elif low is not None and high is not None:
            if high - low > MAX_STEP_RANGE:
                n.unsupported("multipleOf", dpath, f"a range over {MAX_STEP_RANGE} wide")
                step = None
            elif not any(v % step == 0 for v in range(low, high + 1)):
                return Unsat(f"no multiple of {step} lies in [{low}, {high}]")
    out: dict[str, Any] = {"type": "integer"}
    if low is not None:
        out["minimum"] = low
    if high is not None:
        out["maximum"] = high
    if step is not None:
        out["multipleOf"] = step
    return out


# ----- strings ----------------------------------------------------------------------------


def _string(n: Normalizer, node: dict[str, Any], dpath: str, kind: str) -> Schema | Unsat:
    out: dict[str, Any] = {"type": "string"}
    pattern = node.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise n.invalid(dpath, "pattern must be a string")
        try:
            out["pattern"] = rewrite_pattern(pattern)
        except PatternError as e:
            n.unsupported("pattern", dpath, f"{pattern!r} has {e}")
    low, high = _count(n, node, "minLength", dpath), _count(n, node, "maxLength", dpath)
    if "pattern" in out:
        # xgrammar ignores lengths beside a pattern: fine where the pattern implies them
        shortest, longest = pattern_lengths(pattern)
        if low is not None and shortest < low:
            n.unsupported("minLength", dpath, "beside a pattern that allows shorter strings")
        if high is not None and (longest is None or longest > high):
            n.unsupported("maxLength", dpath, "beside a pattern that allows longer strings")
        return out
    if low is not None and high is not None and low > high:
        return Unsat(f"its minLength {low} exceeds its maxLength {high}")
    if n.filtered:
        for key, v in (("minLength", low), ("maxLength", high)):
            if v is not None and not (key == "minLength" and v == 0):
                n.unsupported(key, dpath, "xgrammar drops length bounds beside excludes")
        low = high = None
    if low:
        out["minLength"] = low
    if high is not None:
        out["maxLength"] = high
    fmt = node.get("format")
    if len(out) == 1 and fmt in SHAPED_FORMATS:
        out["format"] = fmt
    return out


# ----- arrays -------------------------------------------------------------------------------


def _array(n: Normalizer, node: dict[str, Any], dpath: str, kind: str) -> Schema | Unsat:
    items = node.get("items")
    prefix = node.get("prefixItems")
    if isinstance(items, list):  # drafts 4-7: a tuple, then additionalItems
        if prefix is not None:
            raise n.invalid(dpath, "items is a list beside prefixItems")
        prefix, items = items, node.get("additionalItems", True)
    elif items is None:
        items = node.get("unevaluatedItems")
    if prefix is not None and not isinstance(prefix, list):
        raise n.invalid(dpath, "prefixItems must be a list of schemas")
    low = _count(n, node, "minItems", dpath) or 0
    high = _count(n, node, "maxItems", dpath)
    out_prefix: list[Schema] = []
    limit: int | None = None  # the most items that can be written
    blocked: Unsat | None = None
    for i, s in enumerate(prefix or ()):
        r = n.norm(s, f"{dpath}[{i}]")
        if isinstance(r, Unsat):
            limit, blocked = i, Unsat(r.reason, r.path or f"{dpath}[{i}]")
            break
        out_prefix.append(r)
    out_items: Schema | None = None
    if limit is None and items is not None:
        r = False if items is False else n.norm(items, f"{dpath}[]")
        if r is False or isinstance(r, Unsat):
            limit = len(out_prefix)
            if isinstance(r, Unsat):
                blocked = Unsat(r.reason, r.path or f"{dpath}[]")
        else:
            out_items = r
    elif limit is None and low > len(out_prefix):
        out_items = {}  # items absent: any value (xgrammar would write none past the prefix)
    if limit is not None:
        out_items = False
        if low > limit:
            return blocked or Unsat(f"it needs {low} items, and only {limit} can be written")
        high = limit if high is None else min(high, limit)
    if high is not None and low > high:
        return Unsat(f"its minItems {low} exceeds its maxItems {high}")
    if node.get("uniqueItems") is True and not (high is not None and high <= 1):
        values = None if out_prefix else _finite(n, out_items)
        if values is None or len(values) > MAX_UNIQUE_SET:
            n.unsupported(
                "uniqueItems", dpath, f"its items are not a set of at most {MAX_UNIQUE_SET} values"
            )
        else:
            top = len(values) if high is None else min(high, len(values))
            arrays = [list(c) for k in range(low, top + 1) for c in combinations(values, k)]
            if not arrays:
                return Unsat(f"it needs {low} distinct items, and only {len(values)} exist")
            return {"enum": arrays}
    out: dict[str, Any] = {"type": "array"}
    if out_prefix:
        out["prefixItems"] = out_prefix
    if out_items is not None:
        out["items"] = out_items
    if low:
        out["minItems"] = low
    if high is not None:
        out["maxItems"] = high
    return out


def _finite(n: Normalizer, schema: Schema | None) -> list[Any] | None:
    """The distinct values a normalized schema admits, if they are few and known."""
    target = n.target(schema) if isinstance(schema, dict) else None
    if not isinstance(target, dict):
        return None
    if "enum" in target:
        out: list[Any] = []
        for v in target["enum"]:
            if not any(json_equal(v, u) for u in out):
                out.append(v)
        return out
    return {"boolean": [True, False], "null": [None]}.get(target.get("type"))  # type: ignore[arg-type]


# ----- objects ------------------------------------------------------------------------------


def _object(n: Normalizer, node: dict[str, Any], dpath: str, kind: str) -> Schema | Unsat:
    props = node.get("properties") or {}
    if not isinstance(props, dict):
        raise n.invalid(dpath, "properties must be an object")
    required = node.get("required")
    required = [] if isinstance(required, bool) or required is None else required
    if not isinstance(required, list) or not all(isinstance(x, str) for x in required):
        raise n.invalid(dpath, "required must be a list of property names")
    required = list(dict.fromkeys(required))
    for name, s in props.items():  # draft 3: ``"required": true`` on the property itself
        if isinstance(s, dict) and s.get("required") is True and name not in required:
            required.append(name)
    extra = node.get("additionalProperties", node.get("unevaluatedProperties"))
    patterns = node.get("patternProperties") or {}
    if not isinstance(patterns, dict):
        raise n.invalid(dpath, "patternProperties must be an object")
    names = node.get("propertyNames")

    schemas: dict[str, Any] = dict(props)
    for name in required:
        if name not in schemas:
            schemas[name] = extra if isinstance(extra, dict) else extra is not False
    for name in schemas:
        parts = [schemas[name]] + [s for p, s in patterns.items() if _search(n, p, name, dpath)]
        if names is not None and not n.validator(names).is_valid(name):
            parts = [False]
        schemas[name] = parts[0] if len(parts) == 1 else {"allOf": parts}

    out_props: dict[str, Any] = {}
    dropped: list[str] = []
    for name, s in schemas.items():
        where = join_path(dpath, name)
        r = n.norm(s, where)
        if isinstance(r, Unsat):
            if name in required:
                if s is False and name not in props:
                    r = Unsat("additionalProperties is false and it is not declared")
                return Unsat(r.reason, r.path or where)
            dropped.append(name)
            n.dropped.append(where)
            continue
        out_props[name] = r
    out: dict[str, Any] = {"type": "object"}
    if out_props or "properties" in node:
        # kept even when empty: xgrammar reads {"type": "object"} as any object, and
        # {"properties": {}} (strict) as no undeclared property
        out["properties"] = out_props
    kept_required = [x for x in required if x in out_props]
    if kept_required:
        out["required"] = kept_required

    if extra is not None:
        r = extra if isinstance(extra, bool) else n.norm(extra, join_path(dpath, "*"))
        out["additionalProperties"] = False if isinstance(r, Unsat) else r
    out_patterns: dict[str, Any] = {}
    for p, s in patterns.items():
        if any(_search(n, p, d, dpath) for d in dropped):
            continue  # it would let a left-out property back in
        try:
            key = rewrite_pattern(p)
        except PatternError as e:
            n.unsupported("patternProperties", dpath, f"{p!r} has {e}")
            continue
        r = n.norm(s, join_path(dpath, f"<{p}>"))
        if isinstance(r, Unsat):
            out["additionalProperties"] = False
        else:
            out_patterns[key] = r
    if out_patterns:
        out["patternProperties"] = out_patterns
    if names is not None:
        name_schema = {"type": "string", **names} if isinstance(names, dict) else names
        r = n.norm(name_schema, join_path(dpath, "<name>"))
        if isinstance(r, Unsat):
            out["additionalProperties"] = False
            out.pop("patternProperties", None)
        else:
            out["propertyNames"] = r
    low, high = _count(n, node, "minProperties", dpath), _count(n, node, "maxProperties", dpath)
    if high is not None and high < len(kept_required):
        return Unsat(f"it requires {len(kept_required)} properties, and allows {high}")
    if low:
        out["minProperties"] = low
        if low > len(out_props) and extra is None and not out_patterns and not dropped:
            out["additionalProperties"] = True  # absent: any property may be added
    if dropped:
        out["additionalProperties"] = False  # so a left-out property cannot come back
    if high is not None:
        out["maxProperties"] = high
    return out


def _search(n: Normalizer, pattern: str, name: str, dpath: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error as e:
        raise n.invalid(dpath, f"patternProperties key {pattern!r} is not a regex: {e}") from None


_BY_TYPE = {
    "null": _plain,
    "boolean": _plain,
    "integer": _number,
    "number": _number,
    "string": _string,
    "array": _array,
    "object": _object,
}
