"""``thinkgate make-model``: a model directory with the real tokenizer of a bundled
vocabulary, that transformers, our tokenizer loader, the chat front end and the
batched runner all read as they read a downloaded model."""

from __future__ import annotations

import random

import pytest

from thinkgate.cli import main
from tokenization import load_tokenizer


def _texts(seed: int, n: int) -> list[str]:
    """Text the tokenizers were not written for: runs drawn from many scripts, digits,
    punctuation, whitespace of every kind, emoji with joiners, combining marks, and
    special-token strings."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r\u00a0\u3000",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "éèêëçñøåßœÆÉÖÜ",
        "東京大阪的一是不了人我在有他这中",
        "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
        "абвгдежзийклмнопрстуфхцчшщыэюя",
        "😀👍🏽👨\u200d👩\u200d👧🇫🇷✓",
        "e\u0301a\u0308o\u0303",
        "'s 'll 're 've 'd 'm 'T",
    ]
    specials = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(1, 12)):
            if rng.random() < 0.08:
                parts.append(rng.choice(specials))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randrange(1, 9))))
        out.append("".join(parts))
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("made") / "model"
    assert (
        main(["make-model", str(root), "--arch", "llama", "--layers", "1", "--hidden", "16"]) == 0
    )
    return root


def test_the_directory_holds_a_real_models_files(made):
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        assert (made / name).is_file(), name


def test_its_tokenizer_is_the_bundled_one(made):
    bundled = load_tokenizer("qwen3")
    ours = load_tokenizer(str(made))
    assert ours.all_token_bytes == bundled.all_token_bytes
    assert ours.special_tokens == bundled.special_tokens
    assert ours.vocab_rows == bundled.vocab_rows == 151936
    assert ours.eos_token_id == bundled.eos_token_id
    assert set(ours.stop_token_ids) == set(bundled.stop_token_ids)
    for text in _texts(1, 300):
        assert ours.encode(text) == bundled.encode(text), text


def test_transformers_reads_it_as_a_model_directory(made):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bundled = load_tokenizer("qwen3")
    hf = AutoTokenizer.from_pretrained(made, local_files_only=True)
    for text in _texts(2, 50):
        assert hf.encode(text, add_special_tokens=False) == bundled.encode(text), text
    model = AutoModelForCausalLM.from_pretrained(made, local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    with torch.inference_mode():
        logits = model(torch.tensor([bundled.encode("hello")])).logits
    assert logits.shape[-1] == 151936


def test_its_chat_template_renders(made):
    from frontend.chat_template import ChatTemplate, resolve_chat_template

    tok = load_tokenizer(str(made))
    source = resolve_chat_template(None, tok.chat_template, tok.name)
    text = ChatTemplate(source).render([{"role": "user", "content": "hi"}], tools=None)
    assert "<|im_start|>user\nhi<|im_end|>" in text


def test_weights_follow_the_seed(tmp_path):
    from thinkgate.make_model import make_model

    def weights(name: str, seed: int) -> bytes:
        root = make_model(tmp_path / name, layers=1, hidden=8, seed=seed, tokenizer_files=False)
        return (root / "model.safetensors").read_bytes()

    assert weights("a", 1) == weights("b", 1) != weights("c", 2)


def test_a_bad_shape_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["make-model", str(tmp_path / "x"), "--hidden", "30", "--heads", "4"])
    assert e.value.code == 2
    assert "must divide into 4 heads" in capsys.readouterr().err


@pytest.mark.slow
def test_the_demo_runs_on_it(made):
    """``thinkgate demo --model DIR``: every request answered (the answers are nonsense,
    but forced calls are calls), exit 0."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "thinkgate", "demo", "--model", str(made), "--max-tokens", "48"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for n in range(1, 8):
        assert f"[{n}] " in out
    assert "error" not in out
    assert out.count("tool_calls     [0] get_") >= 4  # the forced calls
