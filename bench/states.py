"""The grammar mix and the matcher states the benchmarks measure.

Four grammars, as a serving engine meets them: one tool's JSON schema, "required" over
eight tools as a JSON schema, the hermes family's own "required" constraint over the
same eight tools (built by `frontend.tool_formats`, as the front end builds it:
``<tool_call>`` token, one call object, ``</tool_call>`` token, at least one call),
and xgrammar's builtin JSON grammar.

Each row of a batch gets one grammar and one randomly generated valid document for it,
tokenized with the real vocabulary; its matcher accepts a random prefix of those tokens
and stops there. Rows thus sit where real outputs pass: inside strings, between keys,
inside numbers, between calls. Every document is checked by its matcher token by token
(a document the grammar rejects is a bug here, and raises).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from frontend.tool_formats import FunctionTool, create_tool_format
from structured_output.specs import CompileOptions, GrammarSpec, compile_constraint
from tokenization import Tokenizer, load_tokenizer

from .names import GRAMMARS, VOCABS  # noqa: F401  (also read as states.VOCABS)

MARKERS = ("<tool_call>", "</tool_call>")

# ----- the eight tools -------------------------------------------------------------

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "details": {
            "type": "object",
            "properties": {
                "wind": {"type": "boolean"},
                "hours": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["wind"],
        },
        "score": {"type": "number"},
    },
    "required": ["city", "unit"],
}


def _tool(name: str, props: dict, required: list[str]) -> dict:
    params = {"type": "object", "properties": props, "required": required}
    return {"name": name, "parameters": params}


TOOLS = [
    _tool("get_weather", WEATHER["properties"], ["city", "unit"]),
    _tool("get_time", {"tz": {"type": "string"}}, ["tz"]),
    _tool("search", {"query": {"type": "string"}, "limit": {"type": "integer"}}, ["query"]),
    _tool(
        "send_email",
        {
            "to": {"type": "array", "items": {"type": "string"}},
            "subject": {"type": "string"},
            "urgent": {"type": "boolean"},
        },
        ["to", "subject"],
    ),
    _tool(
        "convert",
        {
            "amount": {"type": "number"},
            "from": {"enum": ["USD", "EUR", "JPY"]},
            "to": {"enum": ["USD", "EUR", "JPY"]},
        },
        ["amount", "from", "to"],
    ),
    _tool(
        "book",
        {
            "room": {"type": "string"},
            "slot": {
                "type": "object",
                "properties": {"start": {"type": "string"}, "minutes": {"type": "integer"}},
                "required": ["start"],
            },
        },
        ["room", "slot"],
    ),
    _tool("noop", {}, []),
    _tool(
        "rate",
        {
            "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            "note": {"type": ["string", "null"]},
        },
        ["stars"],
    ),
]

REQUIRED_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"enum": [t["name"]]}, "parameters": t["parameters"]},
                "required": ["name", "parameters"],
            }
            for t in TOOLS
        ]
    },
}


def hermes_tag(tools: list[dict]) -> dict:
    """The hermes family's "required" constraint over ``tools`` (parallel calls on), as
    a structural-tag document: ``create_tool_format("hermes", ...).constraint``, the
    one place the family's constraint is written. The document names the markers by
    their text, so it is the same for every vocabulary that has them as tokens."""
    fmt = create_tool_format("hermes", load_tokenizer("qwen3"))
    calls = [FunctionTool(t["name"], t["parameters"]) for t in tools]
    return json.loads(fmt.constraint(calls, named=None, parallel=True).value)


SPECS = {
    "one_tool_schema": GrammarSpec.of("json_schema", json.dumps(WEATHER)),
    "required_8_tools": GrammarSpec.of("json_schema", json.dumps(REQUIRED_SCHEMA)),
    "hermes_tag": GrammarSpec.of("structural_tag", json.dumps(hermes_tag(TOOLS))),
}

# ----- random valid documents ---------------------------------------------------

_WORDS = [
    "Paris",
    "São Paulo",
    "Zürich",
    "Kraków",
    "New York",
    "東京",
    "Cairo",
    "Reykjavík",
    "the",
    "quarterly",
    "report",
    "meeting",
    "room",
    "budget",
    "draft",
    "naïve",
    "résumé",
    "weather",
    "tomorrow",
    "urgent",
    "please",
    "confirm",
    "2024-05-17",
    "10:30",
    "a/b",
    'say "hi"',
    "line\nbreak",
    "tab\there",
    "emoji 🙂",
    "C:\\temp",
    "x",
    "",
    "42",
]


def _text(rng: random.Random, lo: int = 1, hi: int = 6) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _number(rng: random.Random) -> float | int:
    return rng.choice(
        [rng.randint(-1000, 100000), round(rng.uniform(-1e4, 1e4), rng.randint(1, 6))]
    )


def _weather(rng: random.Random) -> dict:
    d: dict[str, Any] = {"city": _text(rng, 1, 3), "unit": rng.choice(["celsius", "fahrenheit"])}
    if rng.random() < 0.6:
        d["days"] = rng.randint(1, 14)
    if rng.random() < 0.5:
        det: dict[str, Any] = {"wind": rng.random() < 0.5}
        if rng.random() < 0.6:
            det["hours"] = [rng.randint(0, 23) for _ in range(rng.randint(0, 6))]
        d["details"] = det
    if rng.random() < 0.5:
        d["score"] = _number(rng)
    return d


def _args(rng: random.Random, name: str) -> dict:
    """Random valid arguments of tool ``name``, properties in schema order."""
    if name == "get_weather":
        return _weather(rng)
    if name == "get_time":
        return {"tz": rng.choice(["Europe/Paris", "UTC", "America/New_York", _text(rng, 1, 2)])}
    if name == "search":
        d: dict[str, Any] = {"query": _text(rng, 2, 10)}
        if rng.random() < 0.5:
            d["limit"] = rng.randint(1, 100)
        return d
    if name == "send_email":
        d = {
            "to": [
                f"{rng.choice(['ana', 'bo', 'chen', 'dara'])}@example.com"
                for _ in range(rng.randint(1, 3))
            ],
            "subject": _text(rng, 2, 8),
        }
        if rng.random() < 0.5:
            d["urgent"] = rng.random() < 0.5
        return d
    if name == "convert":
        return {
            "amount": _number(rng),
            "from": rng.choice(["USD", "EUR", "JPY"]),
            "to": rng.choice(["USD", "EUR", "JPY"]),
        }
    if name == "book":
        slot: dict[str, Any] = {
            "start": f"2025-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T{rng.randint(10, 19)}:00"
        }
        if rng.random() < 0.5:
            slot["minutes"] = rng.choice([15, 30, 45, 60, 90])
        return {"room": _text(rng, 1, 3), "slot": slot}
    if name == "noop":
        return {}
    if name == "rate":
        d = {"stars": rng.randint(1, 5)}
        if rng.random() < 0.6:
            d["note"] = _text(rng, 1, 8) if rng.random() < 0.8 else None
        return d
    raise KeyError(name)


def _any_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.random() if depth else 0.35 + 0.65 * rng.random()  # the root: object or array
    if depth >= 3 or kind < 0.35:
        return rng.choice([_text(rng), _number(rng), True, False, None, _text(rng, 3, 12)])
    if kind < 0.7:
        return {_text(rng, 1, 2): _any_json(rng, depth + 1) for _ in range(rng.randint(1, 5))}
    return [_any_json(rng, depth + 1) for _ in range(rng.randint(1, 5))]


def _dumps(rng: random.Random, value: Any) -> str:
    """JSON text, compact or spaced or indented (whitespace kept under the limits)."""
    style = rng.random()
    if style < 0.2:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if style < 0.85:
        return json.dumps(value, ensure_ascii=rng.random() < 0.3)
    return json.dumps(value, ensure_ascii=False, indent=1)


Segment = str | int  # ordinary text, or a marker's token id


def document(rng: random.Random, grammar: str, markers: dict[str, int]) -> list[Segment]:
    """A random valid output for ``grammar``: text pieces and marker token ids."""
    if grammar == "one_tool_schema":
        return [_dumps(rng, _weather(rng))]
    if grammar == "required_8_tools":
        calls = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            t = rng.choice(TOOLS)["name"]
            calls.append({"name": t, "parameters": _args(rng, t)})
        return [_dumps(rng, calls)]
    if grammar == "hermes_tag":
        segs: list[Segment] = []
        for i in range(rng.choice([1, 1, 1, 2, 3])):
            t = rng.choice(TOOLS)["name"]
            args = json.dumps(_args(rng, t), ensure_ascii=rng.random() < 0.3)
            if i:
                segs.append("\n")
            segs += [
                markers["<tool_call>"],
                f'\n{{"name": "{t}", "arguments": {args}}}\n',
                markers["</tool_call>"],
            ]
        return segs
    if grammar == "builtin_json":
        return [_dumps(rng, _any_json(rng))]
    raise KeyError(grammar)


# ----- vocabularies ------------------------------------------------------------------


@dataclass
class Vocab:
    """A real vocabulary, with the hermes markers as single tokens."""

    name: str
    tokenizer: Tokenizer
    token_bytes: list[bytes]
    markers: dict[str, int]
    vocab_rows: int

    def encode(self, segments: list[Segment]) -> list[int]:
        ids: list[int] = []
        for s in segments:
            if isinstance(s, int):
                ids.append(s)
            else:
                ids += self.tokenizer.encode(s, special=False)
        return ids


@cache
def vocab(name: str) -> Vocab:
    """``qwen3`` has the markers; o200k_harmony does not, so they take the place of its
    first two reserved tokens (as families do with reserved slots), which keeps the
    vocabulary at its 201,088 rows."""
    tok = load_tokenizer(name)
    token_bytes = list(tok.all_token_bytes)
    markers = {m: tok.special_tokens[m] for m in MARKERS if m in tok.special_tokens}
    if len(markers) < len(MARKERS):
        reserved = sorted(t for s, t in tok.special_tokens.items() if s.startswith("<|reserved_"))
        for m, tid in zip(MARKERS, reserved, strict=False):
            markers[m] = tid
            token_bytes[tid] = m.encode()
    return Vocab(name, tok, token_bytes, markers, tok.vocab_rows)


@cache
def compiled(vocab_name: str) -> dict[str, Any]:
    """The four grammars compiled for one vocabulary as the engine compiles them
    (`structured_output.guard.GuardedGrammar`: sealed special tokens, whitespace left
    to the guard)."""
    import xgrammar as xgr

    from structured_output.guard import GuardedGrammar
    from structured_output.vocab import build_tokenizer_info

    v = vocab(vocab_name)
    specials = {**v.tokenizer.special_tokens, **v.markers}  # sealed, as the engine does
    info = build_tokenizer_info(
        v.token_bytes, v.vocab_rows, v.tokenizer.stop_token_ids, set(specials.values())
    )
    compiler = xgr.GrammarCompiler(info, max_threads=2)
    options = CompileOptions()
    out = {
        name: GuardedGrammar.wrap(*compile_constraint(compiler, spec, options, specials))
        for name, spec in SPECS.items()
    }
    out["builtin_json"] = GuardedGrammar.wrap(compiler.compile_builtin_json_grammar(), True)
    return out


_DEFAULT_BOUND = CompileOptions().max_whitespace


@cache
def guard(vocab_name: str, limit: int | None = _DEFAULT_BOUND) -> Any:
    """The engine's guard table of one vocabulary (`structured_output.guard`), with the
    engine's default whitespace bound (``limit=None``: the engine with the bound off,
    which still guards UTF-8, escapes and control characters)."""
    from structured_output.guard import GuardTable

    v = vocab(vocab_name)
    specials = {**v.tokenizer.special_tokens, **v.markers}
    return GuardTable(v.token_bytes, v.vocab_rows, special_ids=set(specials.values()), limit=limit)


@cache
def peer_compiled(vocab_name: str) -> dict[str, Any]:
    """The same four grammars as a vLLM user gets them: xgrammar's default compilation
    (any whitespace, no bound) over the plain vocabulary (special tokens are text)."""
    import xgrammar as xgr

    v = vocab(vocab_name)
    info = xgr.TokenizerInfo(
        v.token_bytes,
        xgr.VocabType.RAW,
        vocab_size=v.vocab_rows,
        stop_token_ids=list(v.tokenizer.stop_token_ids),
    )
    compiler = xgr.GrammarCompiler(info, max_threads=2)
    return {
        "one_tool_schema": compiler.compile_json_schema(SPECS["one_tool_schema"].value),
        "required_8_tools": compiler.compile_json_schema(SPECS["required_8_tools"].value),
        "hermes_tag": compiler.compile_structural_tag(SPECS["hermes_tag"].value),
        "builtin_json": compiler.compile_builtin_json_grammar(),
    }


# ----- states ------------------------------------------------------------------------


@dataclass
class Row:
    grammar: str
    #: the engine's matcher (`structured_output.guard.GuardedMatcher`), advanced to the
    #: row's state
    matcher: Any
    prefix: list[int]  # the tokens it accepted when made
    #: the same state in the grammar a vLLM user compiles (`peer_compiled`), or None
    peer: Any = None
    #: the same state in a matcher of the engine with the whitespace bound off, or None
    unbounded: Any = None
    #: the whole document and how much of it the matchers accepted, for `advance`
    document: list[int] = field(default_factory=list)
    position: int = 0
    #: the same state in another matcher of the engine, for a second filler (each
    #: filler's matchers keep their own string masks), or None
    bare: Any = None
    #: and in one that keeps no string mask (every step fills), or None
    unkept: Any = None

    @property
    def next_token(self) -> int:
        """The document's next token (allowed by construction); -1 once it is written."""
        return self.document[self.position] if self.position < len(self.document) else -1

    def matchers(self) -> list[Any]:
        ms = (self.matcher, self.peer, self.unbounded, self.bare, self.unkept)
        return [m for m in ms if m is not None]

    def engine_matchers(self) -> list[Any]:
        ms = (self.matcher, self.unbounded, self.bare, self.unkept)
        return [m for m in ms if m is not None]


def as_decoded(matchers: list[list[Any]], prefixes: list[list[int]]) -> list[Callable[[], None]]:
    """For the benches that fill the same states step after step: per row, a hook that
    puts the row's engine matchers back as a decode that wrote its prefix token by token
    leaves them (where it keeps a string's mask, which check it owes after a fill, what
    it remembers mid-escape; `structured_output.string_masks`), so that each step costs
    what the decode's step at that state costs. Each matcher is reset and replays its
    prefix through a one-row filler of its own guard, once, here."""
    from structured_output.bitmask import BitmaskFiller
    from structured_output.guide import RequestGuide

    fillers: dict[int, Any] = {}
    hooks = []
    for ms, prefix in zip(matchers, prefixes, strict=True):
        saved = []
        for m in ms:
            table = m.guard
            filler = fillers.get(id(table))
            if filler is None:
                filler = fillers[id(table)] = BitmaskFiller(
                    1, table.plain.vocab_rows, guard=table, batch_threshold=2
                )
            m.reset()
            guide = [RequestGuide(None, m)]
            for t in prefix:
                filler.fill([0], guide)
                if not m.accept_token(t):
                    raise AssertionError(f"a matcher rejected token {t} of its own prefix")
            kept = None if m.kept is None else m.kept.copy()
            memo = None if m.memo is None else dict(m.memo)
            saved.append((m, m.keep, m.probe, m.rearm, m._table, kept, memo))

        def restore(saved: list = saved) -> None:
            for m, keep, probe, rearm, table, kept, memo in saved:
                m.keep, m.probe, m.rearm, m._table = keep, probe, rearm, table
                if kept is not None:
                    np.copyto(m.kept, kept)
                m.memo = None if memo is None else dict(memo)

        hooks.append(restore)
    return hooks


def decoded_rows(rows: list[Row]) -> Callable[[int], Callable[[], None]]:
    """`as_decoded` for the engine's matchers of ``rows``: a hook over the first ``b``."""
    hooks = as_decoded([r.engine_matchers() for r in rows], [r.prefix for r in rows])

    def first(b: int) -> Callable[[], None]:
        def restore() -> None:
            for h in hooks[:b]:
                h()

        return restore

    return first


def advance(rows: list[Row]) -> None:
    """One decode step: every row's matchers accept its document's next token; a row
    whose document is written starts it again from its first prefix."""
    for r in rows:
        ms = r.matchers()
        if r.next_token < 0:  # the document is written
            for m in ms:
                m.reset()
            if not all(m.accept_token(t) for t in r.prefix for m in ms):
                raise AssertionError(f"{r.grammar} rejected its own document again")
            r.position = len(r.prefix)
        elif all(m.accept_token(r.next_token) for m in ms):
            r.position += 1
        else:
            raise AssertionError(f"{r.grammar} rejected the next token of its document")


def make_rows(
    vocab_name: str,
    n: int,
    seed: int,
    grammars: tuple[str, ...] = GRAMMARS,
    *,
    peer: bool = False,
    unbounded: bool = False,
    bare: bool = False,
    unkept: bool = False,
) -> list[Row]:
    """``n`` rows, grammars in turn, each at a random point of its own random document
    (``peer``: each with its twin in `peer_compiled` too; ``unbounded``: and its twin
    guarded by the table with the bound off; ``bare``: and another engine matcher;
    ``unkept``: and one that keeps no string mask)."""
    import xgrammar as xgr

    from structured_output.guard import GuardedMatcher

    v = vocab(vocab_name)
    grams = compiled(vocab_name)
    table = guard(vocab_name)
    twins = peer_compiled(vocab_name) if peer else {}
    stops = list(v.tokenizer.stop_token_ids)
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        g = grammars[i % len(grammars)]
        ids = v.encode(document(rng, g, v.markers))
        cut = rng.randrange(len(ids))  # 0 .. len-1: something always remains
        m = GuardedMatcher(
            grams[g], table, json_text=grams[g].json_text, override_stop_tokens=stops
        )
        twin = xgr.GrammarMatcher(twins[g], override_stop_tokens=stops) if peer else None
        free = None
        if unbounded:
            bound_off = guard(vocab_name, None)
            free = GuardedMatcher(
                grams[g], bound_off, json_text=grams[g].json_text, override_stop_tokens=stops
            )
        other = plain = None
        if bare:
            other = GuardedMatcher(
                grams[g], table, json_text=grams[g].json_text, override_stop_tokens=stops
            )
        if unkept:
            plain = GuardedMatcher(
                grams[g],
                table,
                json_text=grams[g].json_text,
                override_stop_tokens=stops,
                keep_strings=False,
            )
        for t in ids[:cut]:
            if not all(x.accept_token(t) for x in (m, twin, free, other, plain) if x is not None):
                text = v.tokenizer.decode(ids)
                raise AssertionError(f"{g} rejected token {t} of its own document {text!r}")
        rows.append(Row(g, m, ids[:cut], twin, free, ids, cut, other, plain))
    return rows


def check_documents(vocab_name: str, n: int, seed: int) -> None:
    """Feed ``n`` whole documents per grammar to fresh matchers; each must terminate."""
    import xgrammar as xgr

    v = vocab(vocab_name)
    grams = compiled(vocab_name)
    rng = random.Random(seed)
    stop = v.tokenizer.stop_token_ids[0]
    for g in GRAMMARS:
        for _ in range(n):
            ids = v.encode(document(rng, g, v.markers))
            m = xgr.GrammarMatcher(grams[g], override_stop_tokens=[stop])
            ok = all(m.accept_token(t) for t in ids) and m.accept_token(stop)
            if not ok or not m.is_terminated():
                raise AssertionError(
                    f"{g}: document not accepted whole: {v.tokenizer.decode(ids)!r}"
                )
