"""Issue 13.6: one rule for every family (stated in `reasoning.base`): markers in the
prompt's current turn decide where the output starts, whatever the chat-template
kwargs say; the kwargs decide only where the turn holds none. Parametrized from the
registry: a prompt that opens thinking starts the output in THINKING with thinking
switched off, on, or unset; one that opens and closes it starts it in ANSWER."""

from __future__ import annotations

import pytest

from reasoning import Phase, create_reasoning_parser, reasoning_parser_names
from tests.support.thinking import closing_ids, opening_ids

from .cases import CASES, tokenizer_for

SWITCHES = ("enable_thinking", "thinking")
KWARGS = {
    "off": dict.fromkeys(SWITCHES, False),
    "on": dict.fromkeys(SWITCHES, True),
    "unset": {},
}
#: generation prompts tried, in order: the first that does not already close thinking
PROMPTS = ("Hi", "<|start|>user<|message|>Hi<|end|><|start|>assistant")


@pytest.mark.parametrize("family", reasoning_parser_names())
def test_the_prompt_decides_before_the_kwargs(family: str) -> None:
    case = next(c for c in CASES if c.parser == family)
    tok = tokenizer_for(case)
    parsers = {k: create_reasoning_parser(family, tok, kw) for k, kw in KWARGS.items()}
    opening, closing = opening_ids(parsers["on"]), closing_ids(parsers["on"])
    base = next(
        ids
        for ids in (tok.encode(p) for p in PROMPTS)
        if parsers["on"].prompt_phase(ids) != Phase.ANSWER
    )
    opened = base + opening
    closed = opened + tok.encode("x", special=False) + closing
    for name, parser in parsers.items():
        assert parser.prompt_phase(opened) == Phase.THINKING, name
        assert not parser.reasoning_ended(opened), name
        assert parser.tracker(opened, False).phase == Phase.THINKING, name
        assert parser.prompt_phase(closed) == Phase.ANSWER, name
        assert parser.reasoning_ended(closed), name
        # what the model writes after such a prompt is read as thinking, then answer
        out = tok.encode("hm", special=False) + closing + tok.encode("ok", special=False)
        reasoning, content = parser.split(out, opened)
        assert reasoning == "hm", name
        assert content is not None and content.endswith("ok"), name
