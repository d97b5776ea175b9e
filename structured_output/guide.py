"""The per-request gate between a reasoning tracker and a grammar matcher.

Rules it keeps (DESIGN.md):

- while thinking, no mask: the grammar sees nothing of the thought;
- from the answer's first token on, every token goes through the matcher; a token
  that ends thinking implicitly (Qwen3's ``<tool_call>``) is that first token;
- right after an explicit end marker, the family's layout (Qwen3's ``\\n\\n``) is
  allowed before the grammar's first token, and is not fed to the matcher; the
  tracker reads it (`ReasoningTracker.take_layout`), so the front end drops from
  content exactly what the grammar never saw;
- where the model may still open its thinking (UNDECIDED), every allowed token either
  continues the opening of the thinking or is accepted by the grammar: the mask is the
  grammar's plus the opening's next tokens. Tokens the grammar accepts meanwhile are
  fed tentatively, and rolled back if the thinking opens. A token that only the opening
  allows leaves the grammar (it is rolled back to where it stood before the undecided
  stretch, never marked dead): from then on the mask is the opening's next tokens
  alone, until the thinking opens and the grammar starts afresh after it. So an answer
  never begins with a token its grammar rejects, and the model may think in every
  family whose opening marker shares first letters with an answer (Harmony's
  ``analysis`` channel);
- an implicit-end token that the grammar would reject is banned while thinking, so
  ending the thought can never produce an invalid answer; so is a token that would
  complete a text end marker (OLMo 3's ``</think>`` in ordinary tokens) and carry
  answer bytes after it that the grammar rejects (``>',`` after ``</think``): the
  tracker names the candidates (`ReasoningTracker.ending_tokens`), its own machine
  says which answer bytes each would give (`ReasoningTracker.probe`: layout rules
  included), and the fresh grammar judges them, once per request and tracker state;
  so are the stop tokens, since an output that stops while thinking has no answer at
  all (a constrained answer cannot stop before its grammar may end);
- a reasoning budget forces the end marker once the thought is that long.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from reasoning import AnswerStart, Phase, ReasoningTracker

if TYPE_CHECKING:
    import xgrammar as xgr

    from .jump_forward import ForcedTokens


class GuideError(Exception):
    """The request cannot go on (a token its grammar rejects); the message says why."""


class RequestGuide:
    """Reasoning tracker + optional grammar matcher of one request.

    The engine calls `accept` once per generated token, in order; between steps it
    reads `needs_mask`, `follows_grammar`, `extra_allowed`, `forced_token` and
    `banned` to build the step's constraints. With jump forward on, it also asks
    `jump_forward` for the text the grammar forces after a sampled token.
    """

    __slots__ = (
        "tracker",
        "matcher",
        "phase",
        "budget",
        "banned",
        "follows_grammar",
        "_tentative",
        "_layout",
        "_forced",
        "_probe",
        "_token_ids",
        "_bans",
        "_endings",
        "_ending_bans",
        "__weakref__",
    )

    def __init__(
        self,
        tracker: ReasoningTracker | None,
        matcher: xgr.GrammarMatcher | None,
        *,
        implicit_end_ids: Sequence[int] = (),
        stop_token_ids: Sequence[int] = (),
        budget: int | None = None,
        token_ids: Sequence[int] | None = None,
    ) -> None:
        self.tracker = tracker
        self.matcher = matcher
        self.phase = tracker.phase if tracker is not None else Phase.ANSWER
        self.budget = budget
        #: whether this step's mask starts from the grammar's: False while an undecided
        #: stretch has left the grammar, when `extra_allowed` alone is the mask
        self.follows_grammar = True
        self._tentative = 0
        #: the tracker may still read the next token as layout
        self._layout = False
        self._forced: list[int] = []
        #: the ids the grammar names as tokens (`jump_forward.named_token_ids`); None:
        #: any token may come where it has a token-level element
        self._token_ids = tuple(token_ids) if token_ids is not None else None
        #: for a grammar whose `_token_ids` are None: whether `jump_forward` should also
        #: see if the grammar allows one token alone (a marker xgrammar's forced text
        #: stops before): at the answer's start, and after a jump that wrote the whole
        #: forced text
        self._probe = True
        #: ids never allowed while thinking (when there is a grammar): implicit ends
        #: the grammar would reject, and the stop tokens
        self._bans: tuple[int, ...] = ()
        #: per `ReasoningTracker.ending_tokens` key: `_bans` and the tokens that would
        #: end the thought there with answer bytes the grammar rejects
        self._ending_bans: dict[Hashable, tuple[int, ...]] = {}
        if matcher is not None:
            rejected = [t for t in implicit_end_ids if not _starts_with(matcher, t)]
            self._bans = tuple(dict.fromkeys([*rejected, *stop_token_ids]))
        #: the tracker's `ReasoningTracker.ending_tokens`, where there is a grammar
        self._endings = (
            tracker.ending_tokens if tracker is not None and matcher is not None else None
        )
        #: ids not allowed this step while thinking (set after each token fed)
        self.banned = self._bans
        if self._endings is not None:
            self._update_bans(self._endings())

    # ----- read between steps -------------------------------------------------

    @property
    def needs_mask(self) -> bool:
        """Whether this step's row must be masked (by the grammar, or by
        `extra_allowed` alone where `follows_grammar` is False)."""
        return self.matcher is not None and self.phase != Phase.THINKING

    @property
    def thinking(self) -> bool:
        return self.phase == Phase.THINKING

    def extra_allowed(self) -> Sequence[int]:
        """Ids to allow beside the grammar's mask this step (usually none)."""
        if self.phase == Phase.UNDECIDED and self.tracker is not None:
            return self.tracker.start_marker_continuations()
        if self._layout:
            assert self.tracker is not None
            return self.tracker.layout_continuations()
        return ()

    def forced_token(self) -> int | None:
        """The id this step must produce (a reasoning budget ran out), or None."""
        if self._forced:
            return self._forced[0]
        if (
            self.budget is not None
            and self.phase == Phase.THINKING
            and self.tracker is not None
            and self.tracker.num_reasoning_tokens >= self.budget
        ):
            self._forced = list(self.tracker.end_marker_ids())
            return self._forced[0] if self._forced else None
        return None

    @property
    def num_reasoning_tokens(self) -> int:
        return self.tracker.num_reasoning_tokens if self.tracker is not None else 0

    @property
    def can_jump(self) -> bool:
        """Whether `jump_forward` may find anything: the answer has begun under a
        grammar, past the family's layout."""
        return self.matcher is not None and self.phase == Phase.ANSWER and not self._layout

    def jump_forward(self, forced: ForcedTokens, limit: int) -> list[int]:
        """The tokens (at most ``limit``) the grammar forces next, split as the model's
        tokenizer splits them (`jump_forward.py`), fed to the matcher as if sampled; the
        caller appends them to the output. Empty when nothing is forced. Call only
        where `can_jump` holds, after the last token was fed.

        Forced text stops before a token-level element (a family's marker). Where the
        grammar then allows a single token, that token is appended too (never one that
        ends the grammar: the stop is left to the model's own step), and the forced text
        after it. Which one, a mask of the whole vocabulary says, so it is filled only
        where one of the ids the grammar names as tokens is acceptable; for a grammar
        that may accept any token at such an element (`token_ids` None), only at the
        answer's start and right after forced text that was written whole (so not on
        every step of free text)."""
        m = self.matcher
        assert m is not None
        ids: list[int] = []
        probe, self._probe = self._probe, False
        named = self._token_ids
        while len(ids) < limit:
            text = m.find_jump_forward_string()
            if text:
                whole = forced.encode(text)
                step = forced(text, whole)[: limit - len(ids)]
                for t in step:
                    if not m.accept_token(t):
                        return ids
                    ids.append(t)
                if not forced.writes_all(step, text):
                    # The end of the text is held back in case what follows merges with
                    # it; nothing merges across a marker, so where the grammar allows
                    # a marker alone after the whole text, the rest and the marker go.
                    rest = whole[len(step) :]
                    if named == () or len(ids) + len(rest) >= limit or not _accept_all(m, rest):
                        return ids
                    t = self._lone_token(forced)
                    if t is None or not forced.is_marker(t) or not _accept_ending(m, t):
                        m.rollback(len(rest))
                        return ids
                    ids += rest
                    ids.append(t)
                    continue
                probe = True
            if len(ids) >= limit or not (probe if named is None else named):
                return ids
            probe = False
            t = self._lone_token(forced)
            if t is None or not _accept_ending(m, t):
                return ids
            ids.append(t)
        return ids

    def _lone_token(self, forced: ForcedTokens) -> int | None:
        """The one token the grammar allows next, if one alone, found only where a
        token it names is acceptable (any, when it may accept any token)."""
        m = self.matcher
        named = self._token_ids
        if named is not None and not _accepts_one_of(m, named):
            return None
        return forced.single_allowed(m)

    @property
    def terminated(self) -> bool:
        """Whether the grammar has ended: its matcher accepted a stop token that the
        grammar allowed (so the answer is complete). The engine asks right after
        feeding a stop token."""
        return self.matcher is not None and self.matcher.is_terminated()

    # ----- feed -------------------------------------------------------------------

    def accept(self, token_id: int, output_ids: Sequence[int]) -> None:
        """Feed one generated token; ``output_ids`` is the output so far, this token
        included. Raises `GuideError` when the grammar rejects it."""
        if self._forced and self._forced[0] == token_id:
            self._forced.pop(0)
        phase = self.phase
        if phase == Phase.ANSWER:
            self._accept_answer(token_id)
            return
        tracker = self.tracker
        assert tracker is not None
        if phase == Phase.UNDECIDED and self.matcher is not None and self.follows_grammar:
            if self.matcher.accept_token(token_id):
                self._tentative += 1
            else:
                # Allowed as the opening of the thinking only: the grammar goes back to
                # where it stood, and only the opening may go on.
                self._drop_tentative()
                self.follows_grammar = False
        start = tracker.advance((token_id,))
        self.phase = tracker.phase
        if self.phase == Phase.THINKING:
            self._drop_tentative()
            self.follows_grammar = True
            if self._endings is not None:
                self._update_bans(self._endings())
        elif self.phase == Phase.ANSWER:
            self._begin_answer(start, phase, output_ids)

    def _update_bans(self, hint: tuple[Hashable, Sequence[int]] | None) -> None:
        """While thinking under a grammar: `banned` for the tracker's state now, from
        its ``hint`` (`ReasoningTracker.ending_tokens`; most steps None)."""
        if hint is None:
            self.banned = self._bans
            return
        key, ids = hint
        bans = self._ending_bans.get(key)
        if bans is None:
            bans = self._ending_bans[key] = (*self._bans, *self._rejected_endings(ids))
        self.banned = bans

    def _rejected_endings(self, ids: Sequence[int]) -> list[int]:
        """Those of ``ids`` that, fed now, would end the thought with answer bytes the
        fresh grammar rejects (what `_begin_answer` would raise on)."""
        tracker, m = self.tracker, self.matcher
        assert tracker is not None and m is not None
        verdicts: dict[bytes, bool] = {}
        rejected: list[int] = []
        for t in ids:
            start = tracker.probe(t)
            if start is None or not start.prefix:
                continue
            ok = verdicts.get(start.prefix)
            if ok is None:
                ok = verdicts[start.prefix] = m.accept_string(start.prefix)
                if ok:
                    m.rollback(1)  # the whole string is one step
            if not ok:
                rejected.append(t)
        return rejected

    def _accept_answer(self, token_id: int) -> None:
        if self.matcher is None:
            return
        if self._layout:
            assert self.tracker is not None
            if self.tracker.take_layout(token_id):
                self._layout = self.tracker.in_layout
                return
            self._layout = False
        if not self.matcher.accept_token(token_id):
            raise GuideError(f"the grammar rejected token {token_id} after the end of thinking")

    def _begin_answer(
        self, start: AnswerStart | None, was: Phase, output_ids: Sequence[int]
    ) -> None:
        """Thinking just ended on the last fed token."""
        matcher = self.matcher
        if matcher is None:
            return
        if was == Phase.UNDECIDED:
            # The tentative tokens were the answer's first tokens. An answer cannot
            # begin after the grammar was left: only the opening was allowed then.
            if not self.follows_grammar:
                raise GuideError("the answer began after a token its grammar rejects")
            self._tentative = 0
            return
        index = start.index if start is not None else 1
        prefix = start.prefix if start is not None else b""
        if index <= 0:
            # The answer includes the closing token (and maybe earlier ones).
            for tid in output_ids[len(output_ids) - 1 + index :]:
                if not matcher.accept_token(tid):
                    raise GuideError(
                        f"the answer began with token {tid}, which its grammar rejects"
                    )
        else:
            assert self.tracker is not None
            self._layout = self.tracker.in_layout
        if prefix and not matcher.accept_string(prefix):
            raise GuideError("the answer's first characters are rejected by its grammar")

    def _drop_tentative(self) -> None:
        if self._tentative and self.matcher is not None:
            self.matcher.rollback(self._tentative)
        self._tentative = 0


def _starts_with(matcher: xgr.GrammarMatcher, token_id: int) -> bool:
    """Whether a fresh ``matcher`` accepts ``token_id`` first (state unchanged)."""
    if matcher.accept_token(token_id):
        matcher.rollback(1)
        return True
    return False


def _accept_all(m: xgr.GrammarMatcher, ids: Sequence[int]) -> bool:
    """Feed ``ids``; where one is refused, undo those fed and say False."""
    for n, t in enumerate(ids):
        if not m.accept_token(t):
            m.rollback(n)
            return False
    return True


def _accepts_one_of(m: xgr.GrammarMatcher, ids: Sequence[int]) -> bool:
    """Whether ``m`` accepts one of ``ids`` next (state unchanged)."""
    for t in ids:
        if m.accept_token(t):
            m.rollback(1)
            return True
    return False


def _accept_ending(m: xgr.GrammarMatcher, t: int) -> bool:
    """Feed ``t`` unless it is refused or ends the grammar (a stop is left to the
    model's own step)."""
    if not m.accept_token(t):
        return False
    if m.is_terminated():
        m.rollback(1)
        return False
    return True
