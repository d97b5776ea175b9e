"""Draft tokens without a second model: prompt lookup over n-grams.

For a request whose prompt plus output ends with the n tokens ``s``, the draft is the
up to ``k`` tokens that followed the most recent earlier occurrence of ``s`` (n from
`MAX_N` down to 1: the longest match wins). An answer that copies a field of its
prompt, or repeats a structure it wrote before, gets drafts that the model then only
has to confirm; elsewhere a draft is simply rejected (`multi_token.verify_drafts`).

Each request keeps its own index (`NgramIndex`): the n-grams seen so far, each mapped
to where its most recent occurrence ended. A step indexes only the tokens that are new
since the last one, so a step costs the new tokens times `MAX_N`, whatever the lengths.

Scoring a draft costs the model a position per token, kept or not. So a request whose
draft was rejected whole waits before its next one: 1 step, then 2, 4, ... up to
`MAX_WAIT` while its drafts keep failing; a draft with a kept token ends the wait. An
answer that copies its prompt loses a step now and then; one that never matches costs
a draft every `MAX_WAIT` steps.
"""

from __future__ import annotations

from collections.abc import Sequence

#: the longest n-gram looked up
MAX_N = 3

#: the most steps a request waits between drafts rejected whole
MAX_WAIT = 16


class NgramIndex:
    """One request's n-grams (n = 1..`MAX_N`), each to the index just past its most
    recent occurrence in the request's tokens (prompt, then output); the last token's
    own n-grams are held back until the next one arrives, so a lookup of the current
    suffix finds an *earlier* occurrence."""

    __slots__ = ("seq", "ends", "indexed", "num_prompt", "last", "last_at", "wait", "backoff")

    def __init__(self, prompt_token_ids: Sequence[int]) -> None:
        self.seq: list[int] = list(prompt_token_ids)
        self.num_prompt = len(self.seq)
        #: n-gram -> the index just past its most recent occurrence
        self.ends: dict[tuple[int, ...], int] = {}
        #: n-grams ending at indices up to this one are in ``ends``
        self.indexed = 0
        #: the last draft proposed, and the output's length then
        self.last: list[int] = []
        self.last_at = 0
        #: steps to wait before the next draft, and the wait after the next rejection
        self.wait = 0
        self.backoff = 0

    def propose(self, output_ids: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens to try after ``output_ids`` (which only ever grow), or
        none while waiting after rejected drafts (module docstring)."""
        last = self.last
        if last:
            self.last = []
            if len(output_ids) > self.last_at and output_ids[self.last_at] == last[0]:
                self.backoff = 0
            else:
                self.backoff = min(MAX_WAIT, 2 * self.backoff or 1)
                self.wait = self.backoff
        if self.wait:
            self.wait -= 1
            self.lookup(output_ids, 0)
            return []
        d = self.lookup(output_ids, k)
        if d:
            self.last, self.last_at = d, len(output_ids)
        return d

    def lookup(self, output_ids: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the
        longest suffix (n = `MAX_N` .. 1) of the prompt and ``output_ids``."""
        seq = self.seq
        have = len(seq) - self.num_prompt
        if len(output_ids) > have:
            seq += output_ids[have:]
        total = len(seq)
        ends = self.ends
        for e in range(self.indexed + 1, total):  # all but the last token's n-grams
            for n in range(1, min(MAX_N, e) + 1):
                ends[tuple(seq[e - n : e])] = e
        self.indexed = max(self.indexed, total - 1)
        if k <= 0:
            return []
        for n in range(min(MAX_N, total), 0, -1):
            e = ends.get(tuple(seq[total - n :]))
            if e is not None:
                return seq[e : e + k]
        return []


class NgramDrafter:
    """Proposes up to ``k`` draft tokens per request and step (`NgramIndex`)."""

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"--draft-tokens must be 0 or more, not {k}")
        self.k = k

    def propose(self, r, k: int) -> list[int]:
        """Up to ``k`` (at most ``self.k``) tokens to try after ``r``'s output."""
        index = r.draft_index
        if index is None:
            index = r.draft_index = NgramIndex(r.prompt_token_ids)
        return index.propose(r.output_ids, min(k, self.k))
