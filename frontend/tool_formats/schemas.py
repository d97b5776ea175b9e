"""Reading tools' parameter schemas: checking and normalizing them before a constraint
is built, local ``$ref`` resolution, the properties of an object, and moving a schema
inside a larger one without breaking its references."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from structured_output import GrammarError
from structured_output.json_schemas import normalize_schema

from .base import FunctionTool, ToolFormatError

_DEF_KEYS = ("$defs", "definitions")
_MAX_REF_DEPTH = 32


@dataclass(frozen=True, slots=True)
class NormalizedTools:
    tools: tuple[FunctionTool, ...]
    #: keywords left out (``ignore_unsupported``), each prefixed by its tool
    ignored: tuple[str, ...] = ()
    #: optional parameters left out because no value fits them, as "tool: path"
    dropped: tuple[str, ...] = ()


def normalize_tools(
    tools: Sequence[FunctionTool], *, ignore_unsupported: bool = False
) -> NormalizedTools:
    """``tools`` with their parameter schemas as the grammar enforces them exactly
    (`structured_output.json_schemas`): enum members their type does not admit are
    left out, and so are optional parameters no value fits. A required parameter no
    value fits, or a keyword that cannot be enforced, raises `ToolFormatError` naming
    the tool and the parameter (or the keyword and where it is)."""
    out: list[FunctionTool] = []
    ignored: list[str] = []
    dropped: list[str] = []
    for t in tools:
        if t.parameters is None or t.strict is False:
            out.append(t)
            continue
        try:
            n = normalize_schema(
                t.parameters, ignore_unsupported=ignore_unsupported, subject=f"tool {t.name!r}"
            )
        except GrammarError as e:
            raise ToolFormatError(str(e)) from None
        out.append(replace(t, parameters=n.schema))
        ignored += [f"tool {t.name!r}: {x}" for x in n.ignored]
        dropped += [f"tool {t.name!r}: {x}" for x in n.dropped]
    return NormalizedTools(tuple(out), tuple(ignored), tuple(dropped))


def resolve(schema: Any, root: Any) -> Any:
    """``schema`` with a local ``$ref`` (``#``, ``#/$defs/...``, ``#/definitions/...``)
    followed, repeatedly; other keywords beside the ``$ref`` are ignored."""
    for _ in range(_MAX_REF_DEPTH):
        if not isinstance(schema, dict) or "$ref" not in schema:
            return schema
        schema = _lookup(schema["$ref"], root)
    raise ToolFormatError("parameter schema has a $ref cycle")


def _lookup(ref: Any, root: Any) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise ToolFormatError(f"only local $ref is supported in parameter schemas, not {ref!r}")
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise ToolFormatError(f"parameter schema $ref {ref!r} points nowhere")
        node = node[part]
    return node


class Property(NamedTuple):
    name: str
    schema: Any
    required: bool


def object_properties(schema: Any, root: Any) -> tuple[list[Property], bool]:
    """The declared properties of an object schema, in order, and whether it admits
    properties it does not declare (no ``properties`` and no ``additionalProperties:
    false``). A schema that is not an object raises `ToolFormatError`."""
    s = resolve(schema, root)
    if s is True or s == {}:
        return [], True
    if not isinstance(s, dict) or s.get("type", "object") != "object":
        raise ToolFormatError("a tool's parameters must be an object schema")
    props = s.get("properties") or {}
    required = set(s.get("required") or ())
    out = [Property(k, v, k in required) for k, v in props.items()]
    missing = required - set(props)
    if missing:
        raise ToolFormatError(
            f"required parameters {sorted(missing)} are not declared under properties"
        )
    free = not props and s.get("additionalProperties", True) is not False
    return out, free


def with_defs(sub: Any, root: Any) -> Any:
    """``sub`` as a schema of its own: the root's definitions copied in, so that its
    ``#/$defs/...`` references still resolve. A reference to the root itself (``#``)
    cannot be carried and raises `ToolFormatError`."""
    if not isinstance(root, dict) or not isinstance(sub, dict):
        return sub
    if _refers_to_root(sub):
        raise ToolFormatError("recursive parameter schemas ($ref '#') are not supported here")
    defs = {k: root[k] for k in _DEF_KEYS if k in root and k not in sub}
    return {**sub, **defs} if defs else sub


def _refers_to_root(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("$ref") == "#":
            return True
        return any(_refers_to_root(v) for v in node.values())
    if isinstance(node, list):
        return any(_refers_to_root(v) for v in node)
    return False


def embed(schema: Any, prefix: str) -> tuple[Any, dict[str, Any]]:
    """``schema`` rewritten to live inside another document: its definitions move out
    (returned, keyed ``prefix + name``) and its local references point to them; a
    reference to its own root becomes a reference to a definition of it."""
    defs: dict[str, Any] = {}

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if k == "$ref" and isinstance(v, str) and v.startswith("#"):
                    out[k] = _rewrite_ref(v, prefix)
                elif k not in _DEF_KEYS or node is not schema:
                    out[k] = rewrite(v)
            return out
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    if isinstance(schema, dict):
        for key in _DEF_KEYS:
            for name, sub in (schema.get(key) or {}).items():
                defs[f"{prefix}{key.strip('$')}.{name}"] = rewrite(sub)
    body = rewrite(schema)
    if _refers_to_root(schema):
        defs[f"{prefix}root"] = body
    return body, defs


def _rewrite_ref(ref: str, prefix: str) -> str:
    if ref == "#":
        return f"#/$defs/{prefix}root"
    for key in _DEF_KEYS:
        head = f"#/{key}/"
        if ref.startswith(head):
            name, _, rest = ref[len(head) :].partition("/")
            return f"#/$defs/{prefix}{key.strip('$')}.{name}" + (f"/{rest}" if rest else "")
    raise ToolFormatError(f"unsupported $ref {ref!r} in a parameter schema")
