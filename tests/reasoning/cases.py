"""The family table: for each parser, its vocabulary, kwargs, the phases its outputs
may start in, the pieces its random outputs are made of, and its oracle."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from reasoning import Phase, ReasoningParser, create_reasoning_parser
from tokenization import Tokenizer, load_tokenizer

from . import oracles
from .oracles import Expected

U, T, A = Phase.UNDECIDED, Phase.THINKING, Phase.ANSWER

#: text every family's outputs mix in: JSON-ish, quotes, braces, newlines, multi-byte
#: characters (cut across tokens by the per-byte encodings)
COMMON_TEXT = (
    "Hello",
    " world",
    '{"a": [1, "x"]}',
    "'q'",
    '"',
    "{",
    "}",
    "\n",
    "\n\n",
    " ",
    "漢字",
    "🙂",
    "é",
)

Oracle = Callable[[Tokenizer, Sequence[int], Phase], Expected]


@dataclass(frozen=True)
class Case:
    id: str
    parser: str
    vocab: str
    oracle: Oracle
    #: special tokens added to the base vocabulary (the family's markers, turn markers)
    added: tuple[str, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    phases: tuple[Phase, ...] = (U, T, A)
    #: special tokens sprinkled into outputs
    specials: tuple[str, ...] = ()
    #: texts sprinkled into outputs (markers, partial markers, marker + answer text),
    #: each encoded whole, cut in two, or one byte-group per token
    texts: tuple[str, ...] = ()
    #: sequences of texts with special tokens, encoded with special tokens on, then
    #: concatenated (Harmony headers)
    sequences: tuple[tuple[str, ...], ...] = ()
    #: what opens and what closes reasoning (a special token's name, text, or parts
    #: encoded apart): the structured outputs are [open] (text [close])+ soup
    opens: tuple[str | tuple[str, ...], ...] = ()
    closes: tuple[str | tuple[str, ...], ...] = ()


def _think(
    start: str = "<think>",
    end: str = "</think>",
    implicit: Sequence[str] = (),
    lead: bytes = b"",
    wrapper: oracles.Wrapper | None = None,
    separator: bytes = b"",
) -> Oracle:
    def oracle(tok: Tokenizer, ids: Sequence[int], phase: Phase) -> Expected:
        return oracles.think_tags(
            tok,
            ids,
            phase,
            start=start,
            end=end,
            implicit=implicit,
            lead=lead,
            wrapper=wrapper,
            separator=separator,
        )

    return oracle


def _text(
    starts: Sequence[str],
    ends: Sequence[str],
    implicit: Sequence[str] = (),
    wrapper: oracles.Wrapper | None = None,
    separator: bytes = b"",
) -> Oracle:
    def oracle(tok: Tokenizer, ids: Sequence[int], phase: Phase) -> Expected:
        return oracles.text_markers(
            tok,
            ids,
            phase,
            starts=starts,
            ends=ends,
            implicit=implicit,
            wrapper=wrapper,
            separator=separator,
        )

    return oracle


THINK_TEXT = ("<think>", "</think>", "</think>\n\n", "<thi", "</thi", "</")
ERNIE_WRAP = oracles.wrapper_stripper(b"<response>", b"</response>", True)
HUNYUAN_WRAP = oracles.wrapper_stripper(b"<answer>", b"</answer>", False)
GRANITE_TEXT = (
    "Here is my thought process:",
    "Here's my thought process:\n",
    "Here is my response:",
    "Here's my response:",
    "Here is my response:\n\nOK",
    "Here's my response: {",
    "Here is my",
    "Here's my res",
    "Here",
    " my response",
    "process:",
    ":",
)
HUNYUAN_TEXT = (
    "<think>\n",
    "<think>\n\n",
    "\n</think>\n<answer>\n",
    "</think>\n",
    "\n</think>\n",
    "<answer>\n",
    "<answer>",
    "\n</answer>",
    "</answer>",
    "</ans",
    "\n</th",
)
HARMONY_SEQUENCES = (
    ("<|channel|>analysis<|message|>",),
    ("<|channel|>analy", "sis<|message|>"),
    ("<|start|>assistant<|channel|>analysis<|message|>",),
    ("<|start|>assist", "ant<|channel|>analysis<|message|>"),
    ("<|start|>assistant<|channel|>final<|message|>",),
    ("<|channel|>final<|message|>",),
    ("<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>",),
    ("<|channel|>analysis to=python<|message|>",),
    ("<|start|>assistant",),
    ("<|channel|>",),
    ("analysis",),
    ('{"city": "Paris"}<|call|>',),
    ("done<|return|>",),
    ("thinking...<|end|>",),
)

CASES: tuple[Case, ...] = (
    Case(
        "qwen3",
        "qwen3",
        "qwen3",
        _think(implicit=("<tool_call>",), separator=b"\n\n"),
        specials=("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>"),
        texts=THINK_TEXT,
        opens=("<think>",),
        closes=("</think>", "<tool_call>"),
    ),
    Case(
        "deepseek_r1",
        "deepseek_r1",
        "llama3",
        _think(separator=b"\n\n"),
        added=("<think>", "</think>"),
        specials=("<think>", "</think>", "<|eot_id|>"),
        texts=THINK_TEXT,
        opens=("<think>",),
        closes=("</think>",),
    ),
    Case(
        "deepseek_v3-thinking",
        "deepseek_v3",
        "llama3",
        _think(),
        added=("<think>", "</think>"),
        kwargs={"thinking": True},
        specials=("<think>", "</think>"),
        texts=THINK_TEXT,
        opens=("<think>",),
        closes=("</think>",),
    ),
    Case(
        "glm45",
        "glm45",
        "llama3",
        _think(implicit=("<tool_call>",), lead=b"\n", separator=b"\n"),
        added=("<think>", "</think>", "<tool_call>"),
        specials=("<think>", "</think>", "<tool_call>"),
        texts=(*THINK_TEXT, "\n", "\n\n"),
        opens=("<think>", "\n"),
        closes=("</think>", "<tool_call>"),
    ),
    Case(
        "kimi_k2",
        "kimi_k2",
        "llama3",
        _think(implicit=("<|tool_calls_section_begin|>",)),
        added=("<think>", "</think>", "<|tool_calls_section_begin|>"),
        specials=("<think>", "</think>", "<|tool_calls_section_begin|>"),
        texts=THINK_TEXT,
        opens=("<think>",),
        closes=("</think>", "<|tool_calls_section_begin|>"),
    ),
    Case(
        "minimax_m2",
        "minimax_m2",
        "llama3",
        _think(separator=b"\n\n"),
        added=("<think>", "</think>"),
        specials=("<think>", "</think>"),
        texts=THINK_TEXT,
        opens=("<think>",),
        closes=("</think>",),
    ),
    Case(
        "seed_oss",
        "seed_oss",
        "qwen3",
        _think(start="<seed:think>", end="</seed:think>"),
        added=("<seed:think>", "</seed:think>"),
        specials=("<seed:think>", "</seed:think>", "<think>", "</think>"),
        texts=("<seed:think>", "</seed:think>"),
        opens=("<seed:think>",),
        closes=("</seed:think>",),
    ),
    Case(
        "mistral-tokens",
        "mistral",
        "llama3",
        _think(start="[THINK]", end="[/THINK]", implicit=("[TOOL_CALLS]",)),
        added=("[THINK]", "[/THINK]", "[TOOL_CALLS]"),
        specials=("[THINK]", "[/THINK]", "[TOOL_CALLS]"),
        texts=("[THINK]", "[/THINK]", *THINK_TEXT),
        opens=("[THINK]",),
        closes=("[/THINK]", "[TOOL_CALLS]"),
    ),
    Case(
        "mistral-text",
        "mistral",
        "llama3",
        _text(("<think>",), ("</think>",), implicit=("[TOOL_CALLS]",)),
        added=("[TOOL_CALLS]",),
        specials=("[TOOL_CALLS]",),
        texts=THINK_TEXT,
        opens=("<think>",),
        closes=("</think>", "[TOOL_CALLS]", "</think>\n\n{"),
    ),
    Case(
        "granite",
        "granite",
        "llama3",
        _text(
            ("Here is my thought process:", "Here's my thought process:"),
            ("Here is my response:", "Here's my response:"),
            separator=b"\n",
        ),
        texts=GRANITE_TEXT,
        opens=("Here is my thought process:", "Here's my thought process:\n"),
        closes=("Here is my response:", "Here's my response: {", "Here is my response:\n\nOK"),
    ),
    Case(
        "hunyuan_a13b",
        "hunyuan_a13b",
        "cl100k_base",
        _text(
            ("<think>\n",),
            ("\n</think>\n", "</think>\n"),
            wrapper=HUNYUAN_WRAP,
            separator=b"<answer>\n",
        ),
        texts=HUNYUAN_TEXT,
        opens=("<think>\n", "<think>\n\n"),
        closes=("\n</think>\n<answer>\n", "</think>\n<answer>\nyes\n</answer>", "\n</think>\n\n"),
    ),
    Case(
        "ernie45",
        "ernie45",
        "llama3",
        _think(wrapper=ERNIE_WRAP, separator=b"\n\n<response>\n"),
        added=("<think>", "</think>"),
        specials=("<think>", "</think>"),
        texts=("<response>", "</response>", "<response>\n", "\n</response>\n", "</resp", "\n"),
        opens=("<think>",),
        closes=("</think>", "\n</think>\n\n<response>\nok", "\n</response>\n"),
    ),
    Case(
        "ernie45-special-response",
        "ernie45",
        "qwen3",
        _think(wrapper=ERNIE_WRAP, separator=b"\n\n<response>\n"),
        added=("<response>", "</response>"),
        specials=("<think>", "</think>", "<response>", "</response>"),
        texts=("\n", "\n\n"),
        opens=("<think>",),
        closes=("</think>", "</think>\n\n<response>\n", "\n</response>\n"),
    ),
    Case(
        "olmo3",
        "olmo3",
        "llama3",
        _text(("<think>",), ("</think>",)),
        texts=THINK_TEXT,
        opens=("<think>",),
        closes=("</think>", "</think>\n\nOK"),
    ),
    Case(
        "cohere_command",
        "cohere_command",
        "llama3",
        _think(start="<|START_THINKING|>", end="<|END_THINKING|>"),
        added=("<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>"),
        specials=("<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>"),
        opens=("<|START_THINKING|>",),
        closes=("<|END_THINKING|>",),
    ),
    Case(
        "openai_gptoss",
        "openai_gptoss",
        "o200k_harmony",
        oracles.harmony,
        specials=("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"),
        sequences=HARMONY_SEQUENCES,
        opens=("<|channel|>analysis<|message|>", ("<|channel|>analy", "sis<|message|>")),
        closes=(
            "<|end|>",
            ("<|end|><|start|>assist", "ant<|channel|>an", "alysis<|message|>"),
            ("<|end|><|start|>assist", "ant<|channel|>fin", "al<|message|>"),
            "<|end|><|start|>assistant<|channel|>final<|message|>",
            "<|end|><|start|>assistant<|channel|>analysis<|message|>",
            "<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json"
            "<|message|>",
        ),
    ),
)


_TOKENIZERS: dict[str, Tokenizer] = {}
_PARSERS: dict[str, ReasoningParser] = {}
_STRATEGIES: dict[str, st.SearchStrategy[list[int]]] = {}


def tokenizer_for(case: Case) -> Tokenizer:
    """The case's vocabulary: a real one, with the family's markers added where the
    family's own vocabulary is not bundled (built once per session)."""
    tok = _TOKENIZERS.get(case.id)
    if tok is None:
        tok = _TOKENIZERS[case.id] = load_tokenizer(case.vocab).with_special_tokens(case.added)
    return tok


def parser_for(case: Case) -> ReasoningParser:
    parser = _PARSERS.get(case.id)
    if parser is None:
        parser = create_reasoning_parser(case.parser, tokenizer_for(case), case.kwargs)
        _PARSERS[case.id] = parser
    return parser


def _encodings(tok: Tokenizer, texts: Sequence[str]) -> st.SearchStrategy[list[int]]:
    """One of ``texts`` as ordinary tokens: whole, cut in two at any character, or one
    character per token (so multi-byte characters and markers are cut anywhere)."""
    fixed = [tok.encode(t, special=False) for t in texts]
    fixed += [[i for ch in t for i in tok.encode(ch, special=False)] for t in texts]

    def cut(text_and_at: tuple[str, float]) -> list[int]:
        text, at = text_and_at
        i = int(at * (len(text) + 1))
        return tok.encode(text[:i], special=False) + tok.encode(text[i:], special=False)

    cuts = st.tuples(st.sampled_from(texts), st.floats(0, 1, exclude_max=True)).map(cut)
    return st.one_of(st.sampled_from(fixed), cuts)


def output_strategy(case: Case) -> st.SearchStrategy[list[int]]:
    """Random outputs: lists of pieces, flattened (built once per case)."""
    strategy = _STRATEGIES.get(case.id)
    if strategy is None:
        strategy = _STRATEGIES[case.id] = _output_strategy(case)
    return strategy


def _output_strategy(case: Case) -> st.SearchStrategy[list[int]]:
    """Two in three outputs are structured like a real one (opened, thought, closed,
    answered; each part optional, the closing repeated up to three times), the rest
    random soup."""
    tok = tokenizer_for(case)
    soup = _soup(case, tok, with_specials=True)
    text = _soup(case, tok, with_specials=False)

    def marker(m: str | tuple[str, ...]) -> st.SearchStrategy[list[int]]:
        if isinstance(m, tuple):  # parts with special tokens, encoded apart
            return st.just([t for part in m for t in tok.encode(part)])
        with_specials = tok.encode(m)
        if with_specials != tok.encode(m, special=False):
            return st.just(with_specials)
        return _encodings(tok, [m])

    def optional(markers: tuple[str | tuple[str, ...], ...]) -> st.SearchStrategy[list[int]]:
        return st.one_of(st.just([]), *(marker(m) for m in markers))

    rounds = st.lists(st.tuples(text, optional(case.closes)), min_size=1, max_size=3)
    shaped = st.tuples(optional(case.opens), rounds, soup).map(
        lambda parts: parts[0] + [t for a, b in parts[1] for t in a + b] + parts[2]
    )
    return st.one_of(soup, shaped, shaped)


def _soup(case: Case, tok: Tokenizer, *, with_specials: bool) -> st.SearchStrategy[list[int]]:
    texts = COMMON_TEXT + case.texts
    pieces: list[st.SearchStrategy[list[int]]] = [
        _encodings(tok, texts),
        ordinary_ids(tok).map(lambda t: [t]),
    ]
    if case.specials and with_specials:
        ids = [tok.special_tokens[s] for s in case.specials]
        pieces.append(st.sampled_from(ids).map(lambda t: [t]))
    if case.sequences and with_specials:
        seqs = [[t for part in seq for t in tok.encode(part)] for seq in case.sequences]
        pieces.append(st.sampled_from(seqs))
    return st.lists(st.one_of(pieces), max_size=12).map(lambda ps: [t for p in ps for t in p])


def ordinary_ids(tok: Tokenizer) -> st.SearchStrategy[int]:
    """Any ordinary token with bytes."""
    top = min(tok.num_tokens, 100_000) - 1
    return st.integers(0, top).filter(lambda t: bool(tok.token_bytes(t)) and not tok.is_special(t))


def chunkings(n: int, max_parts: int | None = None) -> st.SearchStrategy[list[int]]:
    """Chunk sizes (>= 1) that sum to ``n``, at most ``max_parts`` of them."""
    if n == 0:
        return st.just([])
    most = n if max_parts is None else min(n, max_parts)
    return st.lists(st.integers(1, n), max_size=most - 1).map(lambda cuts: _sizes(n, cuts))


def _sizes(n: int, cuts: list[int]) -> list[int]:
    points = sorted({c for c in cuts if 0 < c < n})
    return [b - a for a, b in itertools.pairwise([0, *points, n])]


def chunks(ids: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    out, i = [], 0
    for s in sizes:
        out.append(list(ids[i : i + s]))
        i += s
    return out
