"""Markers that are text, found on bytes: the shared helpers and the shared machine.

Some families write their markers as ordinary text of several tokens (granite's
``Here is my response:``, OLMo 3's ``<think>``). Such a marker can be cut anywhere
across tokens, and a token can carry the marker's last bytes together with the first
bytes of what follows. The machine here therefore reads bytes, and holds back only an
unresolved tail: the longest suffix that could still grow into a marker (at most
``len(marker) - 1`` bytes).

Matching rule (the same on the whole output and on any chunking of it): the marker
found is the occurrence that is complete first in the byte stream; of two that
complete at the same byte, the longer.

A family file subclasses `TextMarkersParser` and sets its markers as class
attributes; `AnswerWrapper` (in `answer_wrapper.py`) strips a wrapper around the
answer where the family writes one.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .answer_wrapper import AnswerWrapper, WrapperState
from .base import AnswerStart, Phase, ReasoningError, ReasoningParser, ReasoningTracker, TextSplit
from .vocab import vocab_index

if TYPE_CHECKING:
    from tokenization import Tokenizer


class TextMarker:
    """The spellings (variants) of one text marker, canonical first."""

    __slots__ = ("variants", "_prefixes", "_firsts", "_longest")

    def __init__(self, variants: Sequence[bytes]) -> None:
        if not variants or not all(variants):
            raise ValueError("a text marker needs at least one non-empty spelling")
        self.variants = tuple(variants)
        self._prefixes = frozenset(v[:k] for v in self.variants for k in range(1, len(v)))
        self._firsts = frozenset(v[0] for v in self.variants)
        self._longest = max(map(len, self.variants))

    def find(self, buf: bytes) -> tuple[int, int] | None:
        """``(start, end)`` of the occurrence in ``buf`` that completes first (the longer
        one on a tie), or None. Cost: one ``bytes.find`` per variant."""
        best_end = best_start = -1
        for v in self.variants:
            i = buf.find(v)
            if i >= 0:
                end = i + len(v)
                if best_end < 0 or end < best_end or (end == best_end and i < best_start):
                    best_end, best_start = end, i
        return None if best_end < 0 else (best_start, best_end)

    def tail_len(self, buf: bytes) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a variant
        (bytes that must be held back: they may still become the marker)."""
        firsts, prefixes = self._firsts, self._prefixes
        for k in range(min(len(buf), self._longest - 1), 0, -1):
            if buf[-k] in firsts and buf[-k:] in prefixes:
                return k
        return 0

    def is_proper_prefix(self, buf: bytes) -> bool:
        """Whether ``buf`` is empty or a proper prefix of some variant."""
        return not buf or buf in self._prefixes

    def completed_by(self, buf: bytes) -> bytes | None:
        """The variant that ``buf`` starts with and that completes first, or None."""
        found = [v for v in self.variants if buf.startswith(v)]
        return min(found, key=len) if found else None

    def rfind(self, text: bytes) -> int:
        """Start of the last occurrence of any variant in ``text`` (-1 if none)."""
        return max(text.rfind(v) for v in self.variants)

    def rest_after(self, written: bytes) -> bytes:
        """The bytes that complete the marker after ``written`` (a proper prefix of a
        variant): from the canonical spelling when it fits, else the first that does."""
        for v in self.variants:
            if v.startswith(written):
                return v[len(written) :]
        raise ValueError(f"{written!r} does not start any spelling of the marker")


def text_continuations(
    tokenizer: Tokenizer, written: bytes, markers: TextMarker
) -> tuple[int, ...]:
    """Ids that continue ``written`` (a proper prefix of a spelling) towards a complete
    marker: tokens whose bytes are a prefix of a remainder, and tokens that complete it
    and carry more bytes."""
    index = vocab_index(tokenizer)
    ids: dict[int, None] = {}
    for v in markers.variants:
        if not v.startswith(written) or len(v) == len(written):
            continue
        rest = v[len(written) :]
        ids.update(dict.fromkeys(index.prefixes_of(rest, special=True)))
        ids.update(dict.fromkeys(index.longer_with_prefix(rest)))
    return tuple(ids)


def current_turn(prompt_token_ids: Sequence[int], turn_ids: frozenset[int]) -> Sequence[int]:
    """The ids after the last turn marker (the whole prompt if it has none)."""
    for i in range(len(prompt_token_ids) - 1, -1, -1):
        if prompt_token_ids[i] in turn_ids:
            return prompt_token_ids[i + 1 :]
    return prompt_token_ids


def special_ids(tokenizer: Tokenizer, markers: Sequence[str]) -> frozenset[int]:
    """Ids of those ``markers`` the vocabulary has as special tokens (others ignored)."""
    return frozenset(t for t in (tokenizer.special_tokens.get(m) for m in markers) if t is not None)


def require_special(parser: ReasoningParser, marker: str) -> int:
    """The id of ``marker`` as one special token; `ReasoningError` naming the parser and
    the marker when the vocabulary lacks it."""
    tid = parser.tokenizer.special_tokens.get(marker)
    if tid is None:
        raise ReasoningError(
            f"reasoning parser {parser.name!r} needs the marker {marker!r} as one special "
            f"token, and the vocabulary {parser.tokenizer.name!r} has no such token"
        )
    return tid


class TextMarkersParser(ReasoningParser):
    #: spellings of the text that opens reasoning, canonical first
    start_markers: ClassVar[tuple[str, ...]] = ()
    #: spellings of the text that closes reasoning, canonical first
    end_markers: ClassVar[tuple[str, ...]] = ()
    #: special tokens that close reasoning and are themselves the answer's first token
    implicit_end_markers: ClassVar[tuple[str, ...]] = ()
    #: special tokens that start a turn: the prompt scan stops at one
    turn_markers: ClassVar[tuple[str, ...]] = ()
    #: a wrapper the family writes around its answer, removed from content
    answer_wrapper: ClassVar[AnswerWrapper | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.special_markers = tuple(cls.implicit_end_markers)

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
    ):
        super().__init__(tokenizer, chat_template_kwargs, name=name)
        self.start = TextMarker([m.encode() for m in self.start_markers])
        self.end = TextMarker([m.encode() for m in self.end_markers])
        self._implicit = tuple(require_special(self, m) for m in self.implicit_end_markers)
        self._turn_ids = special_ids(tokenizer, self.turn_markers)
        self._continuations: dict[bytes, tuple[int, ...]] = {}
        self._end_ids: dict[bytes, tuple[int, ...]] = {}
        self._containing: tuple[int, ...] | None = None
        self._endings: dict[tuple[int, bytes], tuple[Hashable, tuple[int, ...]] | None] = {}
        #: `ending_tokens` where nothing is held while scanning (most steps of a
        #: thought), read by the tracker as a plain attribute once known
        self.plain_ending: tuple[Hashable, tuple[int, ...]] | None | object = _UNKNOWN

    @property
    def implicit_end_ids(self) -> Sequence[int]:
        return self._implicit

    def marker_phase(self, prompt_token_ids: Sequence[int]) -> Phase | None:
        text = self.tokenizer.decode_bytes(current_turn(prompt_token_ids, self._turn_ids))
        end_at = self.end.rfind(text)
        start_at = self.start.rfind(text)
        if end_at < 0 and start_at < 0:
            return None
        return Phase.ANSWER if end_at > start_at else Phase.THINKING

    def new_tracker(self, phase: Phase) -> ReasoningTracker:
        return TextMarkersTracker(self, phase)

    def continuations(self, written: bytes) -> tuple[int, ...]:
        """`text_continuations` of the start marker, cached per written prefix."""
        ids = self._continuations.get(written)
        if ids is None:
            ids = self._continuations[written] = text_continuations(
                self.tokenizer, written, self.start
            )
        return ids

    def ending_tokens(self, mode: int, held: bytes) -> tuple[Hashable, tuple[int, ...]] | None:
        """`ReasoningTracker.ending_tokens` of a thinking tracker in ``mode`` that holds
        ``held``, cached: the tokens that contain a whole end spelling with bytes after
        it, and for each suffix of ``held`` that is a proper prefix of a spelling, the
        tokens that start with the rest of that spelling and are longer. None when
        there are none. The key is ``(mode, held)``: the whole state the machine reads
        to close on one token."""
        key = (mode, held)
        hint = self._endings.get(key, _UNKNOWN)
        if hint is _UNKNOWN:
            index = vocab_index(self.tokenizer)
            ids = dict.fromkeys(self._containing_end())
            tail = held[len(held) - self.end.tail_len(held) :]
            for k in range(len(tail), 0, -1):
                for v in self.end.variants:
                    if len(v) > k and v.startswith(tail[-k:]):
                        ids.update(dict.fromkeys(index.longer_with_prefix(v[k:])))
            hint = self._endings[key] = (key, tuple(ids)) if ids else None
            if key == (_SCAN, b""):
                self.plain_ending = hint
        return hint  # type: ignore[return-value]

    def _containing_end(self) -> tuple[int, ...]:
        """The ids whose bytes hold a whole end spelling with bytes after it (one scan
        of the vocabulary, cached)."""
        if self._containing is None:
            variants = self.end.variants
            ids = []
            for t, data in enumerate(self.tokenizer.all_token_bytes):
                for v in variants:
                    i = data.find(v)
                    if i >= 0 and i + len(v) < len(data):
                        ids.append(t)
                        break
            self._containing = tuple(ids)
        return self._containing

    def end_ids(self, written: bytes) -> tuple[int, ...]:
        """The ids of the rest of the end marker after ``written``, cached."""
        ids = self._end_ids.get(written)
        if ids is None:
            rest = self.end.rest_after(written).decode()
            ids = self._end_ids[written] = tuple(self.tokenizer.encode(rest, special=False))
        return ids


_UNKNOWN = object()
_THINKING = Phase.THINKING  # read faster than the enum's attribute

# Tracker modes beyond the phase: while THINKING, whether a leading start marker is
# still being looked for (the prompt opened reasoning and the model may write the
# start marker again; it is dropped).
_SCAN, _LEAD = 0, 1


class TextMarkersTracker(ReasoningTracker):
    """State: ``_held`` bytes not yet assigned (UNDECIDED: the output so far, a proper
    prefix of a start spelling; THINKING: a partial start marker at the very start, or
    the unresolved tail that may become the end marker), ``_marks`` (offsets in
    ``_held`` where tokens begin that have not been counted as reasoning yet),
    ``_undecided`` (tokens in the UNDECIDED stretch), and the answer wrapper's state.

    A token counts as a reasoning token when at least one of its bytes is reasoning.
    """

    __slots__ = ("_p", "_held", "_marks", "_undecided", "_mode", "_wrap", "_tb")

    def __init__(self, parser: TextMarkersParser, phase: Phase) -> None:
        super().__init__(parser, phase)
        self._p = parser
        self._tb = parser.tokenizer.token_bytes
        self._held = b""
        self._marks: tuple[int, ...] = ()
        self._undecided = 0
        self._mode = _LEAD if phase == Phase.THINKING else _SCAN
        wrapper = parser.answer_wrapper
        self._wrap: WrapperState | None = wrapper.initial() if wrapper is not None else None

    # ----- engine hints ---------------------------------------------------------

    def start_marker_continuations(self) -> Sequence[int]:
        if self.phase != Phase.UNDECIDED:
            return ()
        return self._p.continuations(self._held)

    def end_marker_ids(self) -> Sequence[int]:
        if self.phase != Phase.THINKING:
            return ()
        return self._p.end_ids(self._held if self._mode == _SCAN else b"")

    def ending_tokens(self) -> tuple[Hashable, Sequence[int]] | None:
        # Once per thinking step: most steps hold nothing, and read one attribute.
        if self.phase != _THINKING:
            return None
        if self._held or self._mode != _SCAN:
            return self._p.ending_tokens(self._mode, self._held)
        hint = self._p.plain_ending
        return self._p.ending_tokens(_SCAN, b"") if hint is _UNKNOWN else hint  # type: ignore[return-value]

    # ----- rollback -------------------------------------------------------------

    def _snapshot(self) -> Any:
        return (
            self.phase,
            self.num_reasoning_tokens,
            self._held,
            self._marks,
            self._undecided,
            self._mode,
            self._wrap,
        )

    def _restore(self, snapshot: Any) -> None:
        (
            self.phase,
            self.num_reasoning_tokens,
            self._held,
            self._marks,
            self._undecided,
            self._mode,
            self._wrap,
        ) = snapshot

    # ----- the machine ----------------------------------------------------------

    def _flush_text(self) -> TextSplit:
        held, marks, self._held, self._marks = self._held, self._marks, b"", ()
        if self.phase == Phase.THINKING:
            # Held bytes that never became a marker are reasoning after all.
            self.num_reasoning_tokens += len(marks)
            return TextSplit(held, b"")
        content = held
        if self._wrap is not None:
            wrapper = self._p.answer_wrapper
            assert wrapper is not None
            out, self._wrap = wrapper.feed(self._wrap, held) if held else (b"", self._wrap)
            content = out + wrapper.flush(self._wrap)
        return TextSplit(b"", content)

    def _content(self, data: bytes, out: list[bytes]) -> None:
        """Answer bytes to content, through the answer wrapper if the family has one
        (a separator written whole goes through it too, into a list nobody reads)."""
        if self._wrap is None:
            out.append(data)
            return
        wrapper = self._p.answer_wrapper
        assert wrapper is not None
        piece, self._wrap = wrapper.feed(self._wrap, data)
        out.append(piece)

    def _scan(self, buf: bytes, marks: tuple[int, ...], reasoning: list[bytes]) -> bytes | None:
        """Look for the end marker in ``buf`` (held tail + new bytes) while THINKING.

        ``marks``: offsets in ``buf`` where uncounted tokens begin. Emits reasoning,
        counts tokens that received reasoning bytes, and returns the bytes after the
        marker when it completed (the state is then left for the caller to switch)."""
        found = self._p.end.find(buf)
        if found is not None:
            cut = found[0]
            self._held, self._marks = b"", ()
        else:
            cut = len(buf) - self._p.end.tail_len(buf)
            self._held = buf[cut:]
            self._marks = tuple(m - cut for m in marks if m >= cut)
        if cut:
            reasoning.append(buf[:cut])
            self.num_reasoning_tokens += sum(1 for m in marks if m < cut)
        return None if found is None else buf[found[1] :]

    def _advance(
        self, token_ids: Sequence[int], want_text: bool
    ) -> tuple[AnswerStart | None, TextSplit | None]:
        start: AnswerStart | None = None
        reasoning: list[bytes] = []
        content: list[bytes] = []
        p, tb, implicit = self._p, self._tb, self._p.implicit_end_ids
        for i, tid in enumerate(token_ids):
            phase = self.phase
            if phase == Phase.ANSWER:
                if self._layout and self._take_layout(tb(tid)):
                    if want_text and not self._layout:
                        self._content(self._p.content_separator, [])  # the wrapper's opening
                    continue
                if not want_text:
                    break
                self._content(tb(tid), content)
                continue
            data = tb(tid)
            if phase == Phase.UNDECIDED:
                buf = self._held + data
                opened = None if tid in implicit else p.start.completed_by(buf)
                if opened is None:
                    if tid not in implicit and p.start.is_proper_prefix(buf):
                        self._held = buf
                        self._undecided += 1
                        continue
                    self.phase = Phase.ANSWER
                    start = AnswerStart(i - self._undecided)
                    self._held, self._undecided = b"", 0
                    if want_text:
                        self._content(buf, content)
                    continue
                # Reasoning opened; what the token carries after the marker is reasoning
                # (or already the end marker).
                self.phase, self._mode, self._held, self._undecided = Phase.THINKING, _SCAN, b"", 0
                buf, marks = buf[len(opened) :], (0,)
                if not buf:
                    continue
            elif tid in implicit:
                if self._held:
                    reasoning.append(self._held)
                    self.num_reasoning_tokens += len(self._marks)
                self._held, self._marks = b"", ()
                self.phase = Phase.ANSWER
                start = AnswerStart(i)
                if want_text:
                    self._content(data, content)
                continue
            elif not data:
                continue
            elif self._mode == _LEAD:
                buf = self._held + data
                marks = (*self._marks, len(self._held))
                opened = p.start.completed_by(buf)
                if opened is None and p.start.is_proper_prefix(buf):
                    self._held, self._marks = buf, marks
                    continue
                self._mode, self._held, self._marks = _SCAN, b"", ()
                if opened is not None:
                    buf, marks = buf[len(opened) :], (0,)
                    if not buf:
                        continue
            else:
                buf = self._held + data
                marks = (*self._marks, len(self._held))
            after = self._scan(buf, marks, reasoning)
            if after is not None:
                self.phase = Phase.ANSWER
                self._open_layout()
                if self._layout and after and self._take_layout(after):
                    if want_text and not self._layout:
                        self._content(p.content_separator, [])  # the wrapper's opening
                    after = b""
                start = AnswerStart(i + 1, after)
                if want_text and after:
                    self._content(after, content)
        if not want_text:
            return start, None
        return start, TextSplit(b"".join(reasoning), b"".join(content))
