"""`ParserCache`: the one map from chat-template kwargs to a parser that the front end
and the engine both build theirs from."""

from __future__ import annotations

import pytest

from reasoning import ParserCache, Phase, ReasoningError, kwargs_key
from tokenization import Tokenizer


def test_equal_kwargs_share_one_parser(qwen3: Tokenizer) -> None:
    cache = ParserCache("qwen3", qwen3)
    a = cache.get({"enable_thinking": False, "x": [1, {"b": 2, "a": 1}]})
    b = cache.get({"x": [1, {"a": 1, "b": 2}], "enable_thinking": False})
    assert a is b and a.name == "qwen3" and len(cache) == 1
    assert cache.get(None) is cache.get({}) and len(cache) == 2
    # kwargs that differ only in type are different kwargs
    assert cache.get({"enable_thinking": 0}) is not cache.get({"enable_thinking": False})
    assert a.prompt_phase(qwen3.encode("hi")) == Phase.ANSWER  # built with its kwargs


def test_least_recently_used_are_dropped(qwen3: Tokenizer) -> None:
    cache = ParserCache("qwen3", qwen3, max_size=2)
    first = cache.get({"n": 1})
    cache.get({"n": 2})
    assert cache.get({"n": 1}) is first  # used again: now the most recent
    cache.get({"n": 3})  # drops n=2
    assert len(cache) == 2 and cache.get({"n": 1}) is first


def _cycle() -> dict:
    d: dict = {}
    d["self"] = d
    return d


def _deep(n: int) -> dict:
    d: dict = {}
    for _ in range(n):
        d = {"d": d}
    return d


@pytest.mark.parametrize(
    "kwargs",
    [
        {1: "int key"},
        {"nested": {"a": 1, 2: "mixed key types"}},
        {"value": b"bytes"},
        {"value": {1, 2}},
        {"value": float("nan")},
        {"value": (1, 2)},
        _cycle(),
        _deep(100_000),
    ],
    ids=["int-key", "mixed-keys", "bytes", "set", "nan", "tuple", "cycle", "deep"],
)
def test_kwargs_that_are_not_json_like_are_refused(qwen3: Tokenizer, kwargs: dict) -> None:
    with pytest.raises(ReasoningError, match="chat-template kwargs must be JSON-like"):
        kwargs_key(kwargs)
    engine_side = ParserCache("qwen3", qwen3, field="reasoning_parser_kwargs")
    with pytest.raises(ReasoningError, match="^reasoning_parser_kwargs must be JSON-like"):
        engine_side.get(kwargs)


def test_an_unknown_family_lists_the_known_ones(qwen3: Tokenizer) -> None:
    with pytest.raises(KeyError, match="unknown reasoning parser 'nope'; known: .*qwen3"):
        ParserCache("nope", qwen3).get(None)
