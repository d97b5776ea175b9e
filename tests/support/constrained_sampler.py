"""Generation straight through xgrammar with an adversarial random sampler.

Each step fills the matcher's bitmask, takes the allowed ids out of it with numpy,
and samples among those only (a step costs tens of microseconds plus the fill).
The sampler is hostile but made to end: it takes a stop token when the grammar
allows one with probability ``p_stop``, otherwise with probability ``p_close`` a
token that closes strings or structures or is a marker (`_tier`), otherwise any
allowed token uniformly. Free text (``any_text``) ends only with a literal, which
random tokens would almost never spell, so inside free text the sampler now and then
(``p_plan``) starts writing one of the literals that end free text in the grammar
(`free_text_ends`), token by token while the grammar allows it. Every choice comes
from a seeded generator.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xgrammar as xgr

from structured_output import GrammarSpec, LocalCompiler
from tokenization import Tokenizer

#: the sampler's preferences, tried in order: tokens that close a JSON string or a
#: Python string (a quote before any comma), tokens that close a structure or start
#: a closing tag (markers rank with these), and last tokens that separate items
QUOTES = (b'"', b"'")
SEPARATOR = b","
CLOSERS = (b"}", b"]", b")", b">", b"</")


def _tier(token: bytes, special: bool) -> int | None:
    """0/1: closes a JSON/Python string; 2: closes a structure; 3: separates."""
    if not token.strip():
        return None
    comma = token.find(SEPARATOR)
    for k, quote in enumerate(QUOTES):
        q = token.find(quote)
        if q >= 0 and (comma < 0 or q < comma):
            return k
    if comma >= 0:
        return 3
    if special or any(c in token for c in CLOSERS):
        return 2
    return None


@dataclass
class Generation:
    token_ids: list[int]
    #: the grammar terminated: a stop token was sampled where the grammar could end
    finished: bool
    #: the stop token that ended it (not in ``token_ids``)
    stop_id: int | None


def free_text_ends(spec: GrammarSpec) -> list[str]:
    """The literals that follow free text in a structural tag: what a writer of free
    text has to produce to get out of it."""
    if spec.kind.value != "structural_tag":
        return []
    ends: list[str] = []
    for fmt in _walk(json.loads(spec.value)):
        if fmt.get("type") == "tag" and fmt["content"].get("type") == "any_text":
            ends.append(_literal(fmt["end"]))
        if fmt.get("type") == "sequence":
            elements = fmt["elements"]
            for k, e in enumerate(elements[:-1]):
                if e.get("type") == "any_text":
                    text = ""
                    for nxt in elements[k + 1 :]:
                        piece = _literal(nxt)
                        if not piece:
                            break
                        text += piece
                    ends.append(text)
    return sorted({e for e in ends if e})


def _literal(fmt: Any) -> str:
    if isinstance(fmt, str):
        return fmt
    if fmt.get("type") == "const_string":
        return str(fmt["value"])
    if fmt.get("type") == "token" and isinstance(fmt["token"], str):
        return str(fmt["token"])
    return ""


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if "type" in node:
            yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _packed(flags: np.ndarray, rows: int) -> np.ndarray:
    """A boolean per id as 32-bit words, bit k of word w for id 32*w + k (xgrammar's
    bitmask layout)."""
    padded = np.zeros(-(-rows // 32) * 32, dtype=bool)
    padded[: flags.size] = flags
    return np.packbits(padded, bitorder="little").view(np.uint32)


class ConstrainedSampler:
    """Samples under xgrammar constraints with one vocabulary.

    Token classes (stop tokens, the preference tiers, whitespace) are kept as packed
    bitmasks, so a step intersects words and draws from the result without ever
    listing the allowed ids: tens of microseconds, whatever the mask."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        p_stop: float = 0.35,
        p_close: float = 0.5,
        p_plan: float = 0.15,
    ) -> None:
        self.tokenizer = tokenizer
        self.p_stop = p_stop
        self.p_close = p_close
        self.p_plan = p_plan
        self._local = LocalCompiler(tokenizer)
        self.info = self._local.tokenizer_info
        self.rows = self.info.vocab_size
        tiers = [np.zeros(self.rows, dtype=bool) for _ in range(4)]
        blank = np.zeros(self.rows, dtype=bool)
        for i, b in enumerate(tokenizer.all_token_bytes):
            k = _tier(b, i in tokenizer.special_ids)
            if k is not None:
                tiers[k][i] = True
            blank[i] = bool(b) and not b.strip()
        stops = np.zeros(self.rows, dtype=bool)
        stops[list(tokenizer.stop_token_ids)] = True
        self._stops = _packed(stops, self.rows)
        self._not_stops = ~self._stops
        self._tiers = [_packed(t, self.rows) & self._not_stops for t in tiers]
        self._solid = ~_packed(blank, self.rows)
        self._bitmask = xgr.allocate_token_bitmask(1, self.rows)
        self._cache: dict[GrammarSpec, xgr.CompiledGrammar] = {}

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """``spec`` compiled for this vocabulary (cached per spec)."""
        cg = self._cache.get(spec)
        if cg is None:
            cg = self._cache[spec] = self._local.compile(spec)
        return cg

    def matcher(self, compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
        """A matcher of ``compiled`` guarded as the engine guards its matchers
        (whitespace runs bounded, UTF-8 kept valid: `structured_output.guard`)."""
        return self._local.matcher(compiled)

    def _fill(self, matcher: xgr.GrammarMatcher) -> np.ndarray:
        matcher.fill_next_token_bitmask(self._bitmask)
        return self._bitmask.numpy()[0].view(np.uint32)

    def allowed(self, matcher: xgr.GrammarMatcher) -> np.ndarray:
        """The ids the matcher allows next, ascending."""
        words = self._fill(matcher)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: self.rows])

    @staticmethod
    def _draw(words: np.ndarray, rng: random.Random) -> int | None:
        """A random id among the set bits (a random word that has some, then a random
        bit of it), or None if no bit is set."""
        live = np.flatnonzero(words)
        if live.size == 0:
            return None
        w = int(live[rng.randrange(live.size)])
        bits = int(words[w])
        choices = [k for k in range(32) if bits >> k & 1]
        return w * 32 + rng.choice(choices)

    def generate(
        self,
        compiled: xgr.CompiledGrammar,
        rng: random.Random,
        *,
        max_tokens: int = 512,
        free_text_ends: Sequence[str] = (),
    ) -> Generation:
        """Tokens until the grammar terminates or ``max_tokens`` tokens were sampled."""
        matcher = self.matcher(compiled)
        plans = [self.tokenizer.encode(e) for e in free_text_ends]
        plan: list[int] = []
        ids: list[int] = []
        while len(ids) < max_tokens:
            words = self._fill(matcher)
            live = np.count_nonzero(words)
            if live == 0:
                raise AssertionError(f"grammar allows nothing after {ids!r}")
            if plan and not _has(words, plan[0]):
                plan = []
            if not plan and plans and live > words.size // 2 and rng.random() < self.p_plan:
                plan = list(rng.choice(plans))  # free text: write its way out
                if not _has(words, plan[0]):
                    plan = []
            tid: int | None = None
            if plan:
                tid = plan.pop(0)
            elif rng.random() < self.p_stop:
                tid = self._draw(words & self._stops, rng)
            if tid is None and rng.random() < self.p_close:
                for tier in self._tiers:
                    if rng.random() < 0.7:
                        tid = self._draw(words & tier, rng)
                        if tid is not None:
                            break
            if tid is None and rng.random() < 0.5:
                # half the time no whitespace: a whitespace run is bounded by the
                # guard, but every gap in JSON would otherwise fill up
                tid = self._draw(words & self._solid, rng)
            if tid is None:
                tid = self._draw(words, rng)
            assert tid is not None
            if not matcher.accept_token(tid):
                raise AssertionError(f"matcher rejected allowed token {tid} after {ids!r}")
            if self._stops[tid >> 5] >> (tid & 31) & 1:
                if not matcher.is_terminated():
                    raise AssertionError("a stop token was accepted but the grammar went on")
                return Generation(ids, True, tid)
            ids.append(tid)
            if matcher.is_terminated():
                return Generation(ids, True, None)
        return Generation(ids, False, None)


def _has(words: np.ndarray, tid: int) -> bool:
    return bool(words[tid >> 5] >> np.uint32(tid & 31) & 1)
