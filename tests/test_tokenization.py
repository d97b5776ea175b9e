"""The shared tokenizers: bundled vocabularies at their real ids, HF directories,
incremental decoding, and clear errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.tiny_model import build_tiny_model
from tokenization import load_tokenizer

QWEN3_ADDED = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]


def test_qwen3_added_tokens_at_their_real_ids(qwen3):
    assert qwen3.vocab_rows == 151_936
    assert qwen3.num_tokens == 151_669
    assert {qwen3.special_tokens[t] for t in QWEN3_ADDED} == set(range(151_643, 151_669))
    for i, t in enumerate(QWEN3_ADDED):
        assert qwen3.special_tokens[t] == 151_643 + i
        assert qwen3.token_bytes(151_643 + i) == t.encode()
    assert qwen3.eos_token_id == 151_645
    assert qwen3.stop_token_ids == (151_645, 151_643)
    assert qwen3.token_bytes(151_900) == b""  # a padding row


def test_llama3_uses_llama31_names(llama3):
    assert llama3.vocab_rows == 128_256
    assert llama3.special_tokens["<|python_tag|>"] == 128_010
    assert llama3.special_tokens["<|eom_id|>"] == 128_008
    assert llama3.special_tokens["<|eot_id|>"] == 128_009
    assert llama3.bos_token_id == 128_000
    assert set(llama3.stop_token_ids) == {128_009, 128_008, 128_001}
    assert llama3.encode("<|python_tag|>{")[0] == 128_010


def test_harmony_markers(harmony):
    ids = {
        "<|start|>": 200006,
        "<|channel|>": 200005,
        "<|message|>": 200008,
        "<|end|>": 200007,
        "<|return|>": 200002,
        "<|call|>": 200012,
        "<|constrain|>": 200003,
    }
    for text, tid in ids.items():
        assert harmony.id_of(text) == tid
    assert harmony.vocab_rows == 201_088
    assert harmony.eos_token_id == 200_002


def test_encode_specials_and_plain(qwen3):
    ids = qwen3.encode("a<think>b</think>\n\n")
    assert 151_667 in ids and 151_668 in ids and ids[-1] == 271
    plain = qwen3.encode("a<think>b", special=False)
    assert 151_667 not in plain and qwen3.decode(plain) == "a<think>b"


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=0, max_size=60), st.data())
def test_incremental_decode_equals_decode(text, data):
    tok = load_tokenizer("qwen3")
    ids = tok.encode(text + "<tool_call>" + text[::-1])
    d = tok.detokenizer()
    pieces = []
    i = 0
    while i < len(ids):
        n = data.draw(st.integers(1, 4))
        pieces.append(d.push(ids[i : i + n]))
        i += n
    pieces.append(d.flush())
    assert "".join(pieces) == tok.decode(ids)


def test_split_multibyte_character_is_held_back(qwen3):
    ids = qwen3.encode("東京")
    raw = b"".join(qwen3.token_bytes(i) for i in ids)
    assert raw.decode() == "東京"
    d = qwen3.detokenizer()
    out = [d.push([i]) for i in ids]
    assert "".join(out) == "東京"
    assert "\ufffd" not in "".join(out)


def test_with_special_tokens_appends_markers(qwen3):
    tok = qwen3.with_special_tokens(["<｜tool▁calls▁begin｜>", "<think>"])
    assert tok.special_tokens["<think>"] == 151_667
    new = tok.special_tokens["<｜tool▁calls▁begin｜>"]
    assert new == qwen3.num_tokens
    assert tok.vocab_rows == qwen3.vocab_rows
    assert tok.encode("x<｜tool▁calls▁begin｜>y")[1] == new


def test_hf_directory(tmp_path):
    from tokenizers import Tokenizer as HF

    root = build_tiny_model(tmp_path / "m")
    tok = load_tokenizer(str(root))
    hf = HF.from_file(str(root / "tokenizer.json"))
    text = 'Über <think>hi</think> {"a": 1} 東京 <|im_end|>'
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text)) == text
    assert tok.eos_token_id == tok.special_tokens["<|im_end|>"]
    assert set(tok.stop_token_ids) == {
        tok.special_tokens["<|im_end|>"],
        tok.special_tokens["<|endoftext|>"],
    }
    assert tok.vocab_rows == json.loads((root / "config.json").read_text())["vocab_size"]
    assert "add_generation_prompt" in tok.chat_template


def test_unknown_name_and_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_tokenizer("nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(str(tmp_path / "empty"))
    with pytest.raises(KeyError, match="not a single token"):
        load_tokenizer("qwen3").id_of("<nope>")
