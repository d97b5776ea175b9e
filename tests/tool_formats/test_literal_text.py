"""Issue 13.4 for values written as text rather than JSON: a finished call's
arguments are always read back.

pythonic writes Python literals, which ``ast.literal_eval`` reads only without a raw
newline, carriage return or NUL inside a string literal; a raw NUL would also be the
seal of a special token in xgrammar's view (structured_output/vocab.py), and an
encoded surrogate is no text. So inside every free string literal the constraint
admits (a free string parameter, a key or a value of any dict, any value, an item of
any list) no token holding one of those may be allowed, in pythonic's own vocabulary
(the mask property, which a random model would need about a hundred thousand draws
to find). The XML-parameter formats (qwen3_coder, glm45, minimax_m2) write raw values
where newlines are legitimate: there the arguments the parser returns must still be
JSON. Both hold for the adversarial sampler's generations on tools whose parameters
are free text, dicts and lists of anything (`free_tool_set`), in every format of the
registry: every finished call is valid, its arguments JSON.
"""

from __future__ import annotations

import random
import re
import zlib

import pytest

from frontend.tool_formats import FunctionTool
from tests.support.roundtrip import round_trip

from .conftest import FAMILIES, format_for, sampler_for

#: (a free parameter's schema, a short value of it, the text that opens a string
#: literal inside its value)
FREE_STRINGS = [
    ({"type": "string"}, "''", "'"),
    ({"type": "object"}, "{}", "{'"),
    ({"type": "object"}, "{}", "{'k': '"),
    ({}, "None", "'"),
    ({"type": "array"}, "[]", "['"),
    ({"type": "array", "items": {}}, "[]", "[1, '"),
]
#: bytes no Python string literal may hold raw, and an encoded surrogate
NOT_IN_LITERAL = re.compile(rb"[\x00\r\n]|\xed[\xa0-\xbf]")

CI_TOOL_SETS = 1
CI_SAMPLES = 4
FULL_TOOL_SETS = 100
MIN_FINISHED_PCT = 90.0


def test_pythonic_string_literals_hold_only_text() -> None:
    """One tool with a required parameter of each free kind, in order (one compile):
    the earlier ones written short, then the string literal of the next opened."""
    fmt = format_for("pythonic")
    tok = fmt.tokenizer
    sampler = sampler_for(tok)
    props = {f"p{i}": schema for i, (schema, _, _) in enumerate(FREE_STRINGS)}
    tool = FunctionTool("f", {"type": "object", "properties": props, "required": list(props)})
    compiled = sampler.compile(fmt.constraint([tool], named="f", parallel=False))
    for i, (_, _, opening) in enumerate(FREE_STRINGS):
        before = "".join(f"p{j}={short}, " for j, (_, short, _) in enumerate(FREE_STRINGS[:i]))
        prefix = f"[f({before}p{i}={opening}"
        matcher = sampler.matcher(compiled)
        for t in tok.encode(prefix, special=False):
            assert matcher.accept_token(t), f"the constraint refuses {prefix!r}"
        allowed = sampler.allowed(matcher)
        assert len(allowed) > 1000, f"{prefix!r}: not inside free text"
        bad = [
            (int(t), tok.token_bytes(int(t)))
            for t in allowed
            if t in tok.special_ids or NOT_IN_LITERAL.search(tok.token_bytes(int(t)))
        ]
        assert not bad, f"after {prefix!r} the mask allows {bad[:8]}"


def free_tool_set(rng: random.Random) -> list[FunctionTool]:
    """1 to 3 tools whose parameters are free: strings, dicts and lists of anything,
    untyped values, now and then inside a declared object; each required or not."""
    free = [
        {"type": "string"},
        {"type": "object"},
        {},
        {"type": "array"},
        {"type": "array", "items": {"type": "string"}},
        {"type": "object", "additionalProperties": {"type": "string"}},
    ]
    tools = []
    for k in range(rng.randint(1, 3)):
        names = rng.sample(["text", "data", "meta", "items", "note", "extra"], rng.randint(1, 3))
        props = {n: rng.choice(free) for n in names}
        if rng.random() < 0.3:
            props["inner"] = {"type": "object", "properties": {"v": rng.choice(free)}}
        required = [n for n in props if rng.random() < 0.6]
        params = {"type": "object", "properties": props, "required": required}
        tools.append(FunctionTool(f"tool_{k}", params))
    return tools


def _check(family: str, count: int, samples: int) -> None:
    fmt = format_for(family)
    seed = zlib.crc32(f"{family} free".encode())
    rng = random.Random(seed)
    stats = round_trip(
        family,
        fmt,
        sampler_for(fmt.tokenizer),
        [free_tool_set(rng) for _ in range(count)],
        seed=seed,
        samples=samples,
    )
    print("\n" + stats.row())
    assert not stats.failures, "\n".join(stats.failures[:5])
    assert stats.finished_pct >= MIN_FINISHED_PCT, stats.row()


def test_pythonic_free_values_come_back_as_json() -> None:
    """CI runs pythonic (the other formats cost about 2 CPU-seconds each here; the
    full run covers them)."""
    _check("pythonic", CI_TOOL_SETS, CI_SAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_free_values_come_back_as_json_full(family: str) -> None:
    _check(family, FULL_TOOL_SETS, 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_foreign_special_token_inside_free_values(family: str) -> None:
    """Special tokens are sealed behind a NUL byte in the grammar's view
    (structured_output/vocab.py), so free text that admits a NUL would admit every
    special token: ``</think>`` or another family's markers inside an argument. Along
    generations of a call with free string parameters, wherever the mask is wide
    (inside free text), the only special tokens it allows are the format's own markers
    (a closing tag that is a special token ends the value) and the stop tokens."""
    fmt = format_for(family)
    tok = fmt.tokenizer
    sampler = sampler_for(tok)
    props = {"text": {"type": "string"}, "note": {"type": "string", "maxLength": 40}}
    tool = FunctionTool("f", {"type": "object", "properties": props, "required": ["text"]})
    compiled = sampler.compile(fmt.constraint([tool], named="f", parallel=False))
    own = {tok.special_tokens[m] for m in fmt.special_markers if m in tok.special_tokens}
    own |= set(tok.stop_token_ids)
    rng = random.Random(zlib.crc32(family.encode()))
    wide = 0
    for _ in range(2):
        ids = sampler.generate(compiled, rng, max_tokens=160).token_ids
        matcher = sampler.matcher(compiled)
        checked = 0  # a few steps into each free value: its mask changes little after
        for t in ids:
            allowed = sampler.allowed(matcher) if checked < 12 else ()
            if len(allowed) > 1000:
                wide += 1
                checked += 1
                foreign = [int(s) for s in allowed if s in tok.special_ids and s not in own]
                assert not foreign, (
                    f"{family}: inside free text the mask allows special tokens "
                    f"{[tok.token_bytes(s) for s in foreign[:8]]}"
                )
            assert matcher.accept_token(t)
    assert wide, f"{family}: the generations never reached free text"
