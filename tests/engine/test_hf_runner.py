"""The batched Hugging Face runner against transformers' own one-sequence generation.

Tiny models of two architectures over the real qwen3 vocabulary (151,936 rows), random
weights. Rows join at different steps with prompts of mixed lengths (some longer than
the token budget, so prefilled in chunks over several steps; some short enough to be
attended with the decoding rows), finish or are removed while others continue, and a
later row takes a freed slot. Every row's greedy tokens must equal ``generate``'s on
that row alone.

Exact comparison runs in float64: batched matmuls may round differently from
one-sequence ones in the last bits, and in float32 that can flip a greedy choice
between two nearly tied tokens of a random model. In float64 such a tie would need two
logits equal to about 1e-15, which these models never produce. The float32 test
bounds the difference instead.
"""

from __future__ import annotations

import random

import pytest
import torch

from engine_core.runners import RunnerOptions
from engine_core.runners.hf import HFRunner
from tests.support.tiny_model import ARCHS, build_model, load_reference, reference_generate
from tokenization import load_tokenizer


class Row:
    def __init__(self, prompt: list[int], name: str = "") -> None:
        self.request_id = name
        self.prompt_token_ids = prompt
        self.output_ids: list[int] = []
        self.model_seed = 0


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3")


#: every architecture in the default run
EVERY_ARCH = pytest.mark.parametrize("arch", ARCHS)
#: qwen3 in the default run, the others with ``-m slow``
QWEN3_FIRST = pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=[pytest.mark.slow] if a != "qwen3" else []) for a in ARCHS]
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (model directory, transformers' float64 reference), built once."""
    made = {}

    def get(arch: str):
        if arch not in made:
            path = build_model(tmp_path_factory.mktemp(arch) / "m", arch, seed=3)
            made[arch] = (path, load_reference(path))
        return made[arch]

    return get


@pytest.fixture
def model_dir(models, arch):
    return models(arch)[0]


@pytest.fixture
def reference(models, arch):
    return models(arch)[1]


def _runner(tok, model_dir, dtype="float64", **kw) -> HFRunner:
    opts = dict(dtype=dtype, max_num_seqs=6, max_num_batched_tokens=24)
    opts.update(kw)
    return HFRunner(tok, RunnerOptions(**opts), str(model_dir))


def _prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    print(f"prompts seed {seed}")
    return [[rng.randrange(151643) for _ in range(n)] for n in lengths]


def _step(runner: HFRunner, rows: list[Row]) -> None:
    """One greedy step: every ready row appends its argmax."""
    plan = runner.plan(rows)
    logits = runner.forward(plan)
    ready = plan.ready_rows
    assert logits.shape == (len(ready), runner.vocab_rows)
    for r, t in zip(ready, logits.argmax(dim=1).tolist(), strict=True):
        r.output_ids.append(t)


#: (prompt lengths, tokens each row writes, rows joining at each step, rows removed
#: mid-generation at a step)
SMALL = (
    [3, 57, 1, 30, 12, 80, 9, 17],
    [7, 9, 8, 3, 8, 5, 6, 4],
    {0: [0, 1], 2: [2], 3: [3, 4, 5], 6: [6], 7: [7]},
    {1: 5},
)
LARGE = (
    [3, 57, 1, 30, 12, 80, 9, 17, 140, 2, 44, 6],
    [30, 25, 40, 5, 33, 18, 27, 12, 20, 35, 16, 9],
    {0: [0, 1], 2: [2], 3: [3, 4, 5], 6: [6], 9: [7], 14: [8, 9], 20: [10, 11]},
    {1: 11, 9: 30},
)


@EVERY_ARCH
@pytest.mark.parametrize(
    "scale",
    [pytest.param(SMALL, id="small"), pytest.param(LARGE, id="large", marks=pytest.mark.slow)],
)
def test_batch_matches_generate(tok, model_dir, reference, scale):
    lengths, wanted, joins, aborted_at = scale
    prompts = _prompts(11, lengths)
    runner = _runner(tok, model_dir)
    rows: dict[int, Row] = {}
    running: list[Row] = []
    done: dict[int, list[int]] = {}
    step = 0
    while step < 200 and (running or any(s >= step for s in joins)):
        for j in joins.get(step, []):
            rows[j] = Row(prompts[j], str(j))
            runner.add(rows[j])
            running.append(rows[j])
        for j, at in aborted_at.items():
            if at == step and rows[j] in running:
                running.remove(rows[j])
                runner.remove(rows[j])
                done[j] = rows[j].output_ids
        if running:
            _step(runner, running)
        for r in list(running):
            j = int(r.request_id)
            if len(r.output_ids) >= wanted[j]:
                running.remove(r)
                runner.remove(r)
                done[j] = r.output_ids
        step += 1
    assert sorted(done) == list(range(len(prompts)))
    for j in aborted_at:
        assert 0 < len(done[j]) < wanted[j]  # the removed row had started
    for j, out in done.items():
        ref = reference_generate(reference, prompts[j], len(out))
        assert out == ref, f"row {j} (prompt of {lengths[j]} tokens)"


@QWEN3_FIRST
def test_drafts_give_logits_per_token_and_roll_back(tok, model_dir, reference):
    prompts = _prompts(5, [7, 20, 4])
    refs = [reference_generate(reference, p, 16) for p in prompts]
    runner = _runner(tok, model_dir)
    rows = [Row(p, str(i)) for i, p in enumerate(prompts)]
    for r in rows:
        runner.add(r)
    while any(len(r.output_ids) < 3 for r in rows):  # row 1 is prefilled in two steps
        _step(runner, [r for r in rows if len(r.output_ids) < 3])
    # row 0 proposes its true continuation, row 1 a wrong one, row 2 nothing
    k = 4
    wrong = [(t + 1) % 151643 for t in refs[1][3 : 3 + k]]
    drafts = [refs[0][3 : 3 + k], wrong, []]
    plan = runner.plan(rows, drafts)
    logits = runner.forward(plan).clone()
    # position by position: each row's first logits, then the rows with drafts, per draft
    blocks = [b.tolist() for b in plan.logit_blocks()]
    assert blocks == [[0, 1, 2]] + [[0, 1]] * k
    at = [[0, *range(3, 3 + 2 * k, 2)], [1, *range(4, 4 + 2 * k, 2)], [2]]
    assert len(logits) == 3 + 2 * k
    picks = logits.argmax(dim=1).tolist()
    assert [picks[a] for a in at[0]] == refs[0][3 : 3 + k + 1]  # every draft right, + next
    assert picks[1] == refs[1][3]  # the first is independent of the draft
    assert picks[2] == refs[2][3]
    # the logits after each draft token are the model's on that very sequence (up to
    # their rounding to float32)
    seq = prompts[1] + refs[1][:3] + wrong
    with torch.inference_mode():
        full = reference(torch.tensor([seq])).logits[0, -k - 1 :].float()
    assert torch.allclose(logits[at[1]], full, atol=1e-6, rtol=0)
    # accept as an engine would: row 0 all drafts and the next token, row 1 only the
    # next token (its drafts rolled back)
    rows[0].output_ids += [picks[a] for a in at[0]]
    runner.rollback(rows[0], 0)
    rows[1].output_ids.append(picks[1])
    runner.rollback(rows[1], k)
    rows[2].output_ids.append(picks[2])
    assert runner.held(rows[1]) == len(prompts[1]) + len(rows[1].output_ids) - 1
    while any(len(r.output_ids) < 16 for r in rows):
        _step(runner, [r for r in rows if len(r.output_ids) < 16])
    assert [r.output_ids[:16] for r in rows] == refs


@QWEN3_FIRST
@pytest.mark.parametrize("appended", [3, 20])  # short and long (attended alone)
def test_appended_tokens_are_fed_at_once(tok, model_dir, reference, appended):
    """Tokens appended without sampling (what the grammar forces) are fed in the next
    pass together, and the logits after them are the model's."""
    prompts = _prompts(8, [6, 11])
    n = 2 + appended + 4
    refs = [reference_generate(reference, p, n) for p in prompts]
    runner = _runner(tok, model_dir)
    rows = [Row(p) for p in prompts]
    for r in rows:
        runner.add(r)
    _step(runner, rows)
    _step(runner, rows)
    rows[0].output_ids += refs[0][2 : 2 + appended]
    while len(rows[0].output_ids) < n:
        _step(runner, rows)
    assert rows[0].output_ids == refs[0]
    assert rows[1].output_ids == refs[1][: len(rows[1].output_ids)]


@QWEN3_FIRST
def test_float32_stays_within_bound(tok, model_dir):
    """float32, as the engine runs on a CPU: fed the reference's own tokens, the batched
    logits stay within 1e-4 of those of transformers' one-sequence ``generate``, and the
    greedy choice agrees wherever the reference's two best tokens are further apart."""
    ref32 = load_reference(model_dir, "float32")
    prompts = _prompts(2, [5, 33, 14, 2])
    n = 8
    steps = []  # per row: generate's tokens and the logits each came from
    for p in prompts:
        with torch.inference_mode():
            out = ref32.generate(
                torch.tensor([p]),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
        steps.append((out.sequences[0, len(p) :].tolist(), [lg[0] for lg in out.logits]))
    runner = _runner(tok, model_dir, dtype="float32", max_num_batched_tokens=16)
    rows = [Row(p) for p in prompts]
    for r in rows:
        runner.add(r)
    worst = 0.0
    while live := [r for r in rows if len(r.output_ids) < n]:
        plan = runner.plan(live)
        for r, lg in zip(plan.ready_rows, runner.forward(plan), strict=True):
            tokens, logits = steps[rows.index(r)]
            want = logits[len(r.output_ids)]
            worst = max(worst, float((lg - want).abs().max()))
            top2 = want.topk(2).values
            if float(top2[0] - top2[1]) > 2e-4:
                assert int(lg.argmax()) == int(want.argmax())
            r.output_ids.append(tokens[len(r.output_ids)])
    assert worst < 1e-4, worst


def test_refuses_what_it_cannot_run(tok, tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=151936,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=8,
    )
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(tmp_path / "sliding")
    with pytest.raises(ValueError, match="sliding-window"):
        _runner(tok, tmp_path / "sliding")
    model = build_model(tmp_path / "ok", hidden=16)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        _runner(tok, model, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="unknown dtype"):
        _runner(tok, model, dtype="float8")
