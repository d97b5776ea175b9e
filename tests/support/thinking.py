"""Thinking around a forced answer: which reasoning family goes with each tool-call
format, and the texts that open and close a family's thinking, read off its tracker.

`THINKING_FAMILY` pairs every format of the tool-format registry (and the JSON-schema
way) with the reasoning parser of the models that write it:

- hermes, qwen3_coder, json_schema: Qwen3 (``<think>``; ``<tool_call>`` ends it too);
- openai: gpt-oss's Harmony (the analysis channel);
- kimi_k2, glm45, minimax_m2, mistral: their own families (Magistral's ``[THINK]``);
- deepseek_v3: DeepSeek-R1, which writes V3's calls after its thinking;
- deepseek_v31: DeepSeek-V3.1 in thinking mode (the ``deepseek_v3`` parser with
  ``thinking`` on);
- llama3_json: no Llama 3 model thinks; DeepSeek-R1-Distill-Llama (the Llama 3
  vocabulary, R1's ``<think>``) does, so ``deepseek_r1``;
- pythonic: OLMo 3 Think, whose calls are Python calls and whose ``<think>`` is plain
  text (``olmo3``), on a vocabulary without a ``<think>`` token (``VOCABULARY``).
"""

from __future__ import annotations

from collections.abc import Sequence

from reasoning import Phase, ReasoningParser
from tokenization import Tokenizer

THINKING_FAMILY: dict[str, str] = {
    "hermes": "qwen3",
    "qwen3_coder": "qwen3",
    "json_schema": "qwen3",
    "openai": "openai_gptoss",
    "kimi_k2": "kimi_k2",
    "glm45": "glm45",
    "minimax_m2": "minimax_m2",
    "mistral": "mistral",
    "deepseek_v3": "deepseek_r1",
    "deepseek_v31": "deepseek_v3",
    "llama3_json": "deepseek_r1",
    "pythonic": "olmo3",
}

#: the chat-template kwargs that switch each family's thinking on, where one must
THINKING_KWARGS: dict[str, dict[str, bool]] = {"deepseek_v3": {"thinking": True}}

#: a format's vocabulary where the one holding most of its markers is not its models'
VOCABULARY: dict[str, str] = {"pythonic": "llama3"}

#: prompts tried, in order, for one that leaves the output thinking or free to think
#: (Harmony's prompt must end with ``<|start|>assistant``)
PROMPTS = (
    "Call the right tool.",
    "<|start|>user<|message|>Call the right tool.<|end|><|start|>assistant",
)


def opening_ids(parser: ReasoningParser) -> list[int]:
    """The ids that open the family's thinking from an undecided start: its tracker's
    first start-marker continuation, taken until the thinking opens."""
    tracker = parser.new_tracker(Phase.UNDECIDED)
    ids: list[int] = []
    while tracker.phase == Phase.UNDECIDED:
        assert len(ids) < 64, "the opening never completes"
        ids.append(tracker.start_marker_continuations()[0])
        tracker.advance(ids[-1:])
    assert tracker.phase == Phase.THINKING
    return ids


def closing_ids(parser: ReasoningParser) -> list[int]:
    """The ids that close the family's thinking (what a reasoning budget forces)."""
    return list(parser.new_tracker(Phase.THINKING).end_marker_ids())


def thinking_prompt(parser: ReasoningParser, tok: Tokenizer) -> list[int]:
    """The first of `PROMPTS` after which the output may think (it does not start in
    the answer)."""
    for text in PROMPTS:
        ids = tok.encode(text)
        if parser.prompt_phase(ids) != Phase.ANSWER:
            return ids
    raise AssertionError(f"{parser.name}: every prompt leaves the output in its answer")


def thinking_prompts(parser: ReasoningParser, tok: Tokenizer) -> Sequence[list[int]]:
    """Prompts after which the output thinks: one that opens the thinking (as Qwen3.5's
    template does), and, for a family whose output may start undecided, one that
    leaves the model to open it (as older Qwen3 models do)."""
    base = thinking_prompt(parser, tok)
    if parser.prompt_phase(base) == Phase.THINKING:
        return (base,)
    return (base + opening_ids(parser), base)
