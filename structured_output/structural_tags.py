"""Structural tags, made ready for our sealed vocabulary (see `vocab.py`).

Two rewrites, before xgrammar compiles a tag:

1. markers written as text inside the tag's literals (``"begin": "<tool_call>\\n"``,
   a trigger ``"<tool_call>"``, a constant string) become the marker's token, as the
   model writes it (with xgrammar's own marker binder, which also turns free text
   under a token end into token-level free text). A shape the binder cannot rewrite
   is an error for that request (markers left as text could be spelled in pieces,
   which parsers matching token ids never see), and an xgrammar without the binder
   stops the engine at start-up (`require_marker_binding`);
2. every token named by its text (``{"type": "token", "token": "<tool_call>"}``,
   ``exclude_tokens``, ``trigger_tokens``, token-dispatch rules) is replaced by its id,
   since xgrammar cannot find a sealed token by its text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from .specs import GrammarError


def prepare_structural_tag(tag: Any, special_tokens: Mapping[str, int]) -> str:
    """The JSON text of ``tag`` (a structural tag, or a bare format) with its special
    tokens bound and resolved to ids."""
    if not isinstance(tag, dict):
        raise GrammarError("structural_tag spec must be a JSON object")
    if tag.get("type") != "structural_tag":
        tag = {"type": "structural_tag", "format": tag}
    text = json.dumps(tag)
    markers = [m for m in special_tokens if m and json.dumps(m)[1:-1] in text]
    if markers:
        tag = _bind(tag, markers)
    return json.dumps(_resolve(tag, special_tokens))


def _binder() -> Callable[[Any, list[str]], Any]:
    """xgrammar's marker binder (a private function, in the xgrammar range that
    pyproject.toml pins): raises `RuntimeError` if this xgrammar lacks it."""
    try:
        from xgrammar.builtin_structural_tag import _bind_marker_tokens
    except ImportError as e:
        raise RuntimeError(
            f"this xgrammar cannot bind markers to special tokens ({e}); without it a "
            "structural tag's markers would be matched as text. Install the xgrammar "
            "range pinned in pyproject.toml"
        ) from None
    return _bind_marker_tokens


def require_marker_binding() -> None:
    """Check at start-up that xgrammar binds markers as the engine needs: a tag whose
    begin and end are markers comes back with both as token formats."""
    from xgrammar import StructuralTag

    probe = StructuralTag.model_validate(
        {
            "type": "structural_tag",
            "format": {"type": "tag", "begin": "<m>", "content": _PROBE_TEXT, "end": "</m>"},
        }
    )
    try:
        bound = _binder()(probe, ["<m>", "</m>"]).model_dump(mode="json", exclude_none=True)
    except (TypeError, ValueError, AttributeError) as e:
        raise RuntimeError(f"xgrammar's marker binder does not work as expected: {e}") from None
    text = json.dumps(bound)
    if '"type": "token"' not in text or '"begin": "<m>"' in text or '"end": "</m>"' in text:
        raise RuntimeError(
            "xgrammar's marker binder left markers as text; install the xgrammar range "
            "pinned in pyproject.toml"
        )


_PROBE_TEXT = {"type": "const_string", "value": "x"}


def _bind(tag: dict[str, Any], markers: list[str]) -> dict[str, Any]:
    from pydantic import ValidationError
    from xgrammar import StructuralTag

    bind = _binder()
    try:
        model = StructuralTag.model_validate(tag)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise GrammarError(f"invalid structural_tag: {first.get('msg')} at {where}") from None
    try:
        bound = bind(model, markers)
    except ValueError as e:
        # Markers left as text would let the model spell them in pieces, which a
        # parser matching token ids never sees: refuse the tag instead.
        raise GrammarError(
            "structural_tag: its markers cannot all be bound to their special tokens "
            f"({', '.join(markers)}): {e}"
        ) from None
    return bound.model_dump(mode="json", exclude_none=True)


_TOKEN_LISTS = ("exclude_tokens", "trigger_tokens")


def _resolve(node: Any, special: Mapping[str, int]) -> Any:
    if isinstance(node, list):
        return [_resolve(x, special) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _resolve(v, special) for k, v in node.items()}
    kind = out.get("type")
    if kind == "token" and isinstance(out.get("token"), str):
        out["token"] = special.get(out["token"], out["token"])
    for key in _TOKEN_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [special.get(t, t) if isinstance(t, str) else t for t in out[key]]
    if kind == "token_dispatch" and isinstance(out.get("rules"), list):
        out["rules"] = [
            [special.get(r[0], r[0]) if isinstance(r[0], str) else r[0], *r[1:]]
            if isinstance(r, list) and r
            else r
            for r in out["rules"]
        ]
    return out
