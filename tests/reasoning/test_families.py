"""Named checks per family: prompts from real templates, outputs from the families'
documented forms, every split point of the fixture strings."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from reasoning import AnswerStart, Phase, ReasoningParser, create_reasoning_parser
from tokenization import Tokenizer


def parser(name: str, tok: Tokenizer, **kwargs: object) -> ReasoningParser:
    return create_reasoning_parser(name, tok, kwargs)


def one_by_one(
    p: ReasoningParser, phase: Phase, ids: Sequence[int]
) -> list[tuple[int, AnswerStart]]:
    """Engine side, one token per step: (step, AnswerStart) for each step that found one."""
    tracker = p.new_tracker(phase)
    return [(i, s) for i, t in enumerate(ids) if (s := tracker.advance([t])) is not None]


def split_at_every_point(
    p: ReasoningParser,
    tok: Tokenizer,
    phase: Phase,
    text: str,
    *,
    head: Sequence[int] = (),
    raw_content: bool = False,
) -> set[tuple[bytes, bytes]]:
    """The split of ``head`` then ``text`` as ordinary tokens encoded in two pieces, cut
    at every character, fed one token at a time: the set of distinct (reasoning,
    content) results. With ``raw_content``, also checks that the content is the answer
    start's prefix plus the bytes of the tokens from the answer start on, less a
    leading layout (a prefix of the family's separator)."""
    results = set()
    for cut in range(len(text) + 1):
        pieces = tok.encode(text[:cut], special=False) + tok.encode(text[cut:], special=False)
        ids = [*head, *pieces]
        tracker = p.new_tracker(phase)
        answer: tuple[int, bytes] | None = None
        r = c = b""
        for i, t in enumerate(ids):
            piece, start = tracker.split_bytes([t])
            r, c = r + piece.reasoning, c + piece.content
            if start is not None:
                answer = (i + start.index, start.prefix)
        tail = tracker.flush()
        r, c = r + tail.reasoning, c + tail.content
        if raw_content and answer is not None:
            whole = answer[1] + tok.decode_bytes(ids[answer[0] :])
            assert whole.endswith(c)
            assert p.content_separator.startswith(whole[: len(whole) - len(c)])
        results.add((r, c))
    return results


# ----- qwen3 ----------------------------------------------------------------------


QWEN_HISTORY = (
    "<|im_start|>user\nhi<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nold</think>\n\nhello<|im_end|>\n"
    "<|im_start|>user\nand now?<|im_end|>\n"
)


def test_qwen3_thinking_off_ends_reasoning_from_the_prompt(qwen3: Tokenizer) -> None:
    p = parser("qwen3", qwen3, enable_thinking=False)
    prompt = qwen3.encode(QWEN_HISTORY + "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert p.reasoning_ended(prompt)
    assert p.reasoning_ended(qwen3.encode(QWEN_HISTORY + "<|im_start|>assistant\n"))
    out = qwen3.encode('{"a": 1}')
    assert p.split(out, prompt) == (None, '{"a": 1}')
    assert p.split(out) == (None, '{"a": 1}')  # the default reads the (empty) prompt


def test_qwen3_think_end_in_an_earlier_turn_does_not_count(qwen3: Tokenizer) -> None:
    p = parser("qwen3", qwen3)
    prompt = qwen3.encode(QWEN_HISTORY + "<|im_start|>assistant\n")
    assert p.prompt_phase(prompt) == Phase.UNDECIDED
    assert not p.reasoning_ended(prompt)
    assert p.prompt_phase(qwen3.encode(QWEN_HISTORY + "<|im_start|>assistant\n<think>\n")) == (
        Phase.THINKING
    )


def test_qwen3_tool_call_inside_thinking_is_content(qwen3: Tokenizer) -> None:
    p = parser("qwen3", qwen3)
    ids = qwen3.encode('<think>\nI need the weather. <tool_call>\n{"name": "w"}\n</tool_call>')
    at = ids.index(qwen3.special_tokens["<tool_call>"])
    assert qwen3.special_tokens["<tool_call>"] in p.implicit_end_ids
    assert p.split(ids) == ("\nI need the weather. ", '<tool_call>\n{"name": "w"}\n</tool_call>')
    assert p.new_tracker(Phase.UNDECIDED).advance(ids) == AnswerStart(at)
    assert one_by_one(p, Phase.UNDECIDED, ids) == [(at, AnswerStart(0))]


def test_qwen3_engine_hints(qwen3: Tokenizer) -> None:
    p = parser("qwen3", qwen3)
    t = p.new_tracker(Phase.UNDECIDED)
    assert t.start_marker_continuations() == (qwen3.special_tokens["<think>"],)
    assert t.end_marker_ids() == ()
    t.advance(qwen3.encode("<think>hm"))
    assert t.end_marker_ids() == (qwen3.special_tokens["</think>"],)
    assert t.num_reasoning_tokens == 1


# ----- deepseek -------------------------------------------------------------------


def test_deepseek_r1_output_without_start_marker(llama3: Tokenizer) -> None:
    tok = llama3.with_special_tokens(["<think>", "</think>", "<｜Assistant｜>", "<｜User｜>"])
    p = parser("deepseek_r1", tok)
    prompt = tok.encode("<｜User｜>2+2?<｜Assistant｜><think>\n")
    assert p.prompt_phase(prompt) == Phase.THINKING
    assert p.prompt_phase(tok.encode("<｜User｜>2+2?<｜Assistant｜>")) == Phase.THINKING
    out = tok.encode("Two and two.</think>\n\nThe answer is 4.")
    assert p.split(out, prompt) == ("Two and two.", "The answer is 4.")
    # A start marker written anyway is dropped, and not counted.
    stream = p.stream(prompt)
    stream.push(tok.encode("<think>Two and two.</think>4"))
    assert stream.num_reasoning_tokens == len(tok.encode("Two and two."))
    assert p.split(tok.encode("<think>Two and two.</think>4"), prompt) == ("Two and two.", "4")


def test_deepseek_v3_thinking_switch(llama3: Tokenizer) -> None:
    tok = llama3.with_special_tokens(["<think>", "</think>", "<｜Assistant｜>"])
    off = parser("deepseek_v3", tok)
    on = parser("deepseek_v3", tok, thinking=True)
    also_on = parser("deepseek_v3", tok, enable_thinking=True)
    out = tok.encode("<think>hm</think>ok")
    # Off: no reasoning where the prompt says nothing; a prompt that opens it decides.
    assert off.reasoning_ended(tok.encode("<｜Assistant｜>"))
    assert off.reasoning_ended(tok.encode("<｜Assistant｜></think>"))
    assert off.prompt_phase(tok.encode("<｜Assistant｜><think>")) == Phase.THINKING
    assert off.split(out) == (None, "<think>hm</think>ok")
    assert on.prompt_phase(tok.encode("<｜Assistant｜><think>")) == Phase.THINKING
    assert on.prompt_phase(tok.encode("<｜Assistant｜></think>")) == Phase.ANSWER
    assert on.split(out, tok.encode("<｜Assistant｜><think>")) == ("hm", "ok")
    assert also_on.split(tok.encode("hm</think>ok")) == ("hm", "ok")


# ----- glm45 ----------------------------------------------------------------------


def test_glm45_newline_before_think(llama3: Tokenizer) -> None:
    tok = llama3.with_special_tokens(["<think>", "</think>", "<tool_call>", "<|assistant|>"])
    p = parser("glm45", tok)
    prompt = tok.encode("<|assistant|>")
    ids = tok.encode("\n<think>Let me see.</think>\nSure.")
    assert p.prompt_phase(prompt) == Phase.UNDECIDED
    assert p.split(ids, prompt) == ("Let me see.", "Sure.")
    t = p.new_tracker(Phase.UNDECIDED)
    newline = tok.encode("\n")[0]
    assert set(t.start_marker_continuations()) >= {tok.special_tokens["<think>"], newline}
    t.advance([newline])
    assert t.start_marker_continuations() == (tok.special_tokens["<think>"],)
    # A newline and then the answer: the answer began at the newline, in an earlier step.
    assert one_by_one(p, Phase.UNDECIDED, tok.encode("\nSure.")) == [(1, AnswerStart(-1))]
    assert p.split(tok.encode("\nSure."), prompt) == (None, "\nSure.")
    assert p.split(tok.encode("\n\nSure."), prompt) == (None, "\n\nSure.")


def test_glm45_thinking_off(llama3: Tokenizer) -> None:
    tok = llama3.with_special_tokens(["<think>", "</think>", "<tool_call>", "<|assistant|>"])
    p = parser("glm45", tok, enable_thinking=False)
    assert p.reasoning_ended(tok.encode("<|assistant|>\n<think></think>"))
    assert p.reasoning_ended(tok.encode("<|assistant|>"))
    history = "<|assistant|>\n<think>old</think>\nhi<|user|>\nq"
    assert not parser("glm45", tok).reasoning_ended(tok.encode(history + "<|assistant|>"))


# ----- kimi, minimax, seed, cohere ------------------------------------------------


def test_kimi_k2(llama3: Tokenizer) -> None:
    markers = ["<think>", "</think>", "<|tool_calls_section_begin|>", "<|im_assistant|>"]
    tok = llama3.with_special_tokens(markers)
    p = parser("kimi_k2", tok)
    prompt = tok.encode("<|im_assistant|>assistant<|im_middle|>")
    assert p.prompt_phase(prompt) == Phase.THINKING
    ids = tok.encode("<think>look it up<|tool_calls_section_begin|><|tool_call_begin|>")
    assert p.split(ids, prompt) == ("look it up", "<|tool_calls_section_begin|><|tool_call_begin|>")
    assert parser("kimi_k2", tok, thinking=False).split(ids, prompt) == (None, tok.decode(ids))


def test_minimax_m2_starts_inside_reasoning(llama3: Tokenizer) -> None:
    tok = llama3.with_special_tokens(["<think>", "</think>", "]~b]"])
    p = parser("minimax_m2", tok)
    prompt = tok.encode("]~b]user\nhi[e~[\n]~b]ai\n<think>\n")
    assert p.prompt_phase(prompt) == Phase.THINKING
    assert p.prompt_phase(tok.encode("]~b]ai\n")) == Phase.THINKING
    assert p.split(tok.encode("hmm\n</think>\n\nHello"), prompt) == ("hmm\n", "Hello")


def test_seed_oss_like_qwen3(qwen3: Tokenizer) -> None:
    tok = qwen3.with_special_tokens(["<seed:think>", "</seed:think>", "<seed:bos>"])
    p = parser("seed_oss", tok)
    assert p.prompt_phase(tok.encode("<seed:bos>assistant\n")) == Phase.UNDECIDED
    budget_zero = "<seed:bos>assistant\n<seed:think>budget is 0</seed:think>"
    assert p.reasoning_ended(tok.encode(budget_zero))
    assert parser("seed_oss", tok, enable_thinking=False).reasoning_ended(tok.encode("x"))
    assert p.split(tok.encode("<seed:think>a</seed:think>b")) == ("a", "b")


def test_cohere_command(llama3: Tokenizer) -> None:
    markers = ["<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>"]
    tok = llama3.with_special_tokens([*markers, "<|START_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>"])
    p = parser("cohere_command", tok)
    prompt = tok.encode("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    assert p.prompt_phase(prompt) == Phase.UNDECIDED
    ids = tok.encode("<|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>hi")
    assert p.split(ids, prompt) == ("plan", "<|START_RESPONSE|>hi")


# ----- mistral --------------------------------------------------------------------


def test_mistral_special_tokens(llama3: Tokenizer) -> None:
    markers = ["[THINK]", "[/THINK]", "[TOOL_CALLS]", "[INST]", "[/INST]"]
    tok = llama3.with_special_tokens(markers)
    p = parser("mistral", tok)
    # Magistral's system prompt itself holds [THINK]...[/THINK]; the scan stops at [/INST].
    prompt = tok.encode("[SYSTEM_PROMPT]Think in [THINK]x[/THINK].[INST]hi[/INST]")
    assert p.prompt_phase(prompt) == Phase.UNDECIDED
    assert p.split(tok.encode("[THINK]hm[/THINK]Hi"), prompt) == ("hm", "Hi")
    assert p.split(tok.encode("Hi [THINK]"), prompt) == (None, "Hi [THINK]")
    ids = tok.encode('[THINK]call it[TOOL_CALLS]get[ARGS]{"a": 1}')
    assert p.split(ids, prompt) == ("call it", '[TOOL_CALLS]get[ARGS]{"a": 1}')


def test_mistral_text_think_on_older_vocabularies(llama3: Tokenizer) -> None:
    tok = llama3.with_special_tokens(["[TOOL_CALLS]", "[INST]", "[/INST]"])
    p = parser("mistral", tok)
    prompt = tok.encode("[INST]Use <think>...</think> first. hi[/INST]")
    assert p.prompt_phase(prompt) == Phase.UNDECIDED
    assert p.split(tok.encode("<think>hm</think>Hi"), prompt) == ("hm", "Hi")
    assert p.split(tok.encode("<thinking is fun"), prompt) == (None, "<thinking is fun")
    assert p.split(tok.encode("<think>hm[TOOL_CALLS]x"), prompt) == ("hm", "[TOOL_CALLS]x")
    # A partial end marker held back when [TOOL_CALLS] arrives was reasoning after all.
    ids = tok.encode("<think>hm </thi[TOOL_CALLS]x")
    assert p.split(ids, prompt) == ("hm </thi", "[TOOL_CALLS]x")
    stream = p.stream(prompt)
    stream.push(ids)
    assert stream.num_reasoning_tokens == len(tok.encode("hm </thi"))


# ----- granite --------------------------------------------------------------------

GRANITE = "Here is my thought process:\nIt is 4.\nHere is my response:\n\nFour."


def test_granite_end_marker_cut_anywhere(llama3: Tokenizer) -> None:
    p = parser("granite", llama3)
    results = split_at_every_point(p, llama3, Phase.UNDECIDED, GRANITE, raw_content=True)
    # The separator (one newline) is layout where a token of its own carries it; a
    # "\n\n" token runs past it and is the answer's, whole.
    assert results == {(b"\nIt is 4.\n", b"\nFour."), (b"\nIt is 4.\n", b"\n\nFour.")}


def test_granite_last_marker_token_carries_the_answer(llama3: Tokenizer) -> None:
    p = parser("granite", llama3)
    ids = llama3.encode("Here's my thought process: hm. Here is my response:\n\nOK")
    colon = next(i for i, t in enumerate(ids) if llama3.token_bytes(t).startswith(b":\n\n"))
    assert one_by_one(p, Phase.UNDECIDED, ids) == [(colon, AnswerStart(1, b"\n\n"))]
    assert p.new_tracker(Phase.UNDECIDED).advance(ids) == AnswerStart(colon + 1, b"\n\n")
    assert p.split(ids) == (" hm. ", "\n\nOK")


def test_granite_without_the_start_phrase_is_content(llama3: Tokenizer) -> None:
    p = parser("granite", llama3)
    ids = llama3.encode("Here is my answer: 4")
    # Undecided while the output could still be "Here is my thought process:".
    steps = one_by_one(p, Phase.UNDECIDED, ids)
    assert steps == [(3, AnswerStart(-3))]
    assert p.split(ids) == (None, "Here is my answer: 4")


def test_granite_engine_hints(llama3: Tokenizer) -> None:
    p = parser("granite", llama3)
    t = p.new_tracker(Phase.UNDECIDED)
    here = llama3.encode("Here")
    assert set(here) <= set(t.start_marker_continuations())
    t.advance(llama3.encode("Here is my thought process"))
    colon_ids = set(t.start_marker_continuations())
    assert llama3.encode(":")[0] in colon_ids
    assert any(llama3.token_bytes(i).startswith(b":\n") for i in colon_ids)
    t.advance(llama3.encode(":\nhm. Here is my"))
    forced = t.end_marker_ids()
    assert llama3.decode(forced) == " response:"
    assert t.advance(forced) == AnswerStart(len(forced))


def test_granite_prompt(llama3: Tokenizer) -> None:
    tok = llama3.with_special_tokens(["<|start_of_role|>", "<|end_of_role|>"])
    p = parser("granite", tok)
    history = "<|start_of_role|>assistant<|end_of_role|>Here is my response: hi"
    assert p.prompt_phase(tok.encode(history + "<|start_of_role|>assistant<|end_of_role|>")) == (
        Phase.UNDECIDED
    )
    prefilled = "<|start_of_role|>assistant<|end_of_role|>Here is my thought process:"
    assert p.prompt_phase(tok.encode(prefilled)) == Phase.THINKING


# ----- hunyuan --------------------------------------------------------------------

HUNYUAN = "<think>\nIt is 4.\n</think>\n<answer>\nFour.\n</answer>"


def test_hunyuan_cut_anywhere(llama3: Tokenizer) -> None:
    p = parser("hunyuan_a13b", llama3)
    assert split_at_every_point(p, llama3, Phase.UNDECIDED, HUNYUAN) == {(b"It is 4.", b"Four.")}


def test_hunyuan_thinking_off(llama3: Tokenizer) -> None:
    tok = llama3.with_special_tokens(["<|extra_0|>", "<|startoftext|>"])
    p = parser("hunyuan_a13b", tok)
    prompt = tok.encode("<|startoftext|>hi<|extra_0|><think>\n\n</think>\n")
    assert p.reasoning_ended(prompt)
    assert p.split(tok.encode("<answer>\nFour.\n</answer>"), prompt) == (None, "Four.")
    history = "<|startoftext|>q<|extra_0|><think>\nold\n</think>\n<answer>\nA\n</answer><|eos|>"
    assert p.prompt_phase(tok.encode(history + "<|startoftext|>q2<|extra_0|>")) == Phase.UNDECIDED
    # The think block is optional.
    assert p.split(tok.encode("<answer>\nFour.\n</answer>")) == (None, "Four.")
    assert p.split(tok.encode("Four.")) == (None, "Four.")


# ----- ernie45 --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("abc\n</think>\n\n<response>\ndef\n</response>\n", "abc\n", "def"),
        ("abc\n</think>\ndef", "abc\n", "def"),
        (
            "abc\n</think>\n\n\n<tool_call>\n{}\n</tool_call>\n",
            "abc\n",
            "<tool_call>\n{}\n</tool_call>\n",
        ),
        ("<think>abc</think>\n\n<response>\nd\n\ne\n</response>\nafter", "abc", "d\n\neafter"),
        # Only the first close tag is the wrapper's.
        ("a</think><response>\nx\n</response>\ny\n</response>", "a", "xy\n</response>"),
        # No wrapper: the newlines after </think> go, the rest stays as written.
        ("a</think>\n\nx\n</response>", "a", "x\n</response>"),
    ],
)
def test_ernie45_forms(llama3: Tokenizer, text: str, reasoning: str, content: str) -> None:
    tok = llama3.with_special_tokens(["<think>", "</think>"])
    p = parser("ernie45", tok)
    assert p.split(tok.encode(text)) == (reasoning, content)
    before, _, answer = text.partition("</think>")
    head = tok.encode(before + "</think>")
    cut_anywhere = split_at_every_point(p, tok, Phase.THINKING, answer, head=head)
    assert cut_anywhere == {(reasoning.encode(), content.encode())}


def test_ernie45_rollback_inside_the_wrapped_answer(llama3: Tokenizer) -> None:
    """A partly undone call is replayed in text mode: the wrapper's state follows."""
    tok = llama3.with_special_tokens(["<think>", "</think>"])
    p = parser("ernie45", tok)
    head = tok.encode("a</think>\n\n<response>\nxy")
    rest = tok.encode("\n</response>\n")
    rolled, plain = p.new_tracker(Phase.THINKING), p.new_tracker(Phase.THINKING)
    rolled.split_bytes(head + tok.encode("\n\nz"))
    rolled.rollback(len(tok.encode("\n\nz")))
    plain.split_bytes(head)
    assert rolled.split_bytes(rest) == plain.split_bytes(rest)
    assert rolled.flush() == plain.flush()


def test_ernie45_response_tags_as_special_tokens(qwen3: Tokenizer) -> None:
    tok = qwen3.with_special_tokens(["<response>", "</response>"])
    p = parser("ernie45", tok)
    assert p.split(tok.encode("abc</think>\n\n<response>\ndef\n</response>\n")) == ("abc", "def")


# ----- olmo3 ----------------------------------------------------------------------

OLMO = "<think>Two and two.</think>Four."


def test_olmo3_cut_anywhere_and_optional_start(llama3: Tokenizer) -> None:
    p = parser("olmo3", llama3)
    assert p.prompt_phase(llama3.encode("<|im_start|>assistant\n")) == Phase.THINKING
    for text in (OLMO, OLMO.removeprefix("<think>")):
        results = split_at_every_point(p, llama3, Phase.THINKING, text, raw_content=True)
        assert results == {(b"Two and two.", b"Four.")}
    # A later <think> is reasoning text.
    assert p.split(llama3.encode("a<think>b</think>c")) == ("a<think>b", "c")


def test_olmo3_prompt_scan_stops_at_the_turn(qwen3: Tokenizer) -> None:
    p = parser("olmo3", qwen3)
    closed = "<|im_start|>assistant\n<think>x</think>"
    assert p.prompt_phase(qwen3.encode(closed)) == Phase.ANSWER
    later = closed + "y<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    assert p.prompt_phase(qwen3.encode(later)) == Phase.THINKING


# ----- openai_gptoss (Harmony) ----------------------------------------------------

HARMONY_PROMPT = "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant"


def test_harmony_prompt_phases(harmony: Tokenizer) -> None:
    p = parser("openai_gptoss", harmony)
    assert p.prompt_phase(harmony.encode(HARMONY_PROMPT)) == Phase.UNDECIDED
    analysis = HARMONY_PROMPT + "<|channel|>analysis<|message|>Hmm"
    assert p.prompt_phase(harmony.encode(analysis)) == Phase.THINKING
    final = HARMONY_PROMPT + "<|channel|>final<|message|>"
    assert p.prompt_phase(harmony.encode(final)) == Phase.ANSWER


def test_harmony_analysis_then_final(harmony: Tokenizer) -> None:
    p = parser("openai_gptoss", harmony)
    prompt = harmony.encode(HARMONY_PROMPT)
    out = (
        "<|channel|>analysis<|message|>Need weather.<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Call the tool.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Sunny.<|return|>"
    )
    ids = harmony.encode(out)
    final_at = len(harmony.encode(out.split("<|start|>assistant<|channel|>final")[0]))
    assert p.split(ids, prompt) == (
        "Need weather.\nCall the tool.",
        "<|start|>assistant<|channel|>final<|message|>Sunny.<|return|>",
    )
    steps = one_by_one(p, Phase.UNDECIDED, ids)
    # Decided at "final", three tokens after the message's first token.
    assert steps == [(final_at + 3, AnswerStart(-3))]
    assert p.new_tracker(Phase.UNDECIDED).advance(ids) == AnswerStart(final_at)
    stream = p.stream(prompt)
    stream.push(ids)
    bodies = ("Need weather.", "Call the tool.")
    assert stream.num_reasoning_tokens == sum(len(harmony.encode(b)) for b in bodies)


@pytest.mark.parametrize(
    "header",
    [
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
        "<|channel|>analysis to=python<|message|>",
        "<|channel|>final<|message|>",
    ],
)
def test_harmony_other_headers_start_the_answer(harmony: Tokenizer, header: str) -> None:
    p = parser("openai_gptoss", harmony)
    ids = harmony.encode(header + '{"city": "Paris"}<|call|>')
    assert p.split(ids, harmony.encode(HARMONY_PROMPT)) == (None, harmony.decode(ids))
    assert p.new_tracker(Phase.UNDECIDED).advance(ids) == AnswerStart(0)


def test_harmony_engine_hints(harmony: Tokenizer) -> None:
    p = parser("openai_gptoss", harmony)
    special = harmony.special_tokens
    t = p.new_tracker(Phase.UNDECIDED)
    assert t.start_marker_continuations() == (special["<|channel|>"],)
    t.advance([special["<|channel|>"]])
    assert harmony.encode("analysis")[0] in t.start_marker_continuations()
    t.advance(harmony.encode("analysis<|message|>thinking"))
    assert t.phase == Phase.THINKING
    assert t.end_marker_ids() == (special["<|end|>"],)
    assert t.advance([special["<|end|>"]]) is None
    assert t.phase == Phase.UNDECIDED
    assert t.start_marker_continuations() == (special["<|start|>"],)


# ----- rollback -------------------------------------------------------------------


def test_rollback_past_the_window_is_refused(qwen3: Tokenizer) -> None:
    p = parser("qwen3", qwen3)
    t = p.new_tracker(Phase.UNDECIDED)
    ids = qwen3.encode("<think>" + "a " * 40)
    for tid in ids:
        t.advance([tid])
    count = t.num_reasoning_tokens
    with pytest.raises(ValueError, match="rollback window"):
        t.rollback(t.ROLLBACK_WINDOW + 1)
    assert (t.phase, t.num_reasoning_tokens) == (Phase.THINKING, count)
    t.rollback(t.ROLLBACK_WINDOW)
    assert t.num_reasoning_tokens == count - t.ROLLBACK_WINDOW
