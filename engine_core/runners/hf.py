"""A Hugging Face causal LM from a local directory, with KV-cached incremental decoding."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from .base import ModelRunner, RunnerOptions, RunnerRow


class HFRunner(ModelRunner):
    """Loads ``path`` with transformers (``local_files_only``: nothing is downloaded).
    Each request keeps its own cache; a row's first forward is its prompt's prefill,
    every later one feeds just the newest token."""

    def __init__(self, tokenizer, options: RunnerOptions, path: str) -> None:
        super().__init__(tokenizer, options)
        from transformers import AutoModelForCausalLM

        if not Path(path, "config.json").is_file():
            raise FileNotFoundError(f"{path!r} is not a model directory (no config.json)")
        torch.manual_seed(options.seed)
        self.model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        self.model.to(self.device).eval()
        rows = int(self.model.config.vocab_size)
        if rows < tokenizer.num_tokens:
            raise ValueError(
                f"model has {rows} vocabulary rows, its tokenizer {tokenizer.num_tokens} tokens"
            )
        self.vocab_rows = rows
        self._cache: dict[str, tuple[object, int]] = {}
        self._out = torch.empty(
            (options.max_num_seqs, rows), dtype=torch.float32, device=self.device
        )

    def remove(self, row: RunnerRow) -> None:
        self._cache.pop(row.request_id, None)

    @torch.inference_mode()
    def forward(self, rows: Sequence[RunnerRow]) -> torch.Tensor:
        out = self._out[: len(rows)]
        for i, r in enumerate(rows):
            ids = r.prompt_token_ids + r.output_ids
            past, seen = self._cache.get(r.request_id, (None, 0))
            new = ids[seen:] if past is not None else ids
            inp = torch.tensor([new], dtype=torch.long, device=self.device)
            res = self.model(input_ids=inp, past_key_values=past, use_cache=True)
            self._cache[r.request_id] = (res.past_key_values, len(ids))
            out[i] = res.logits[0, -1].float()
        return out

    def close(self) -> None:
        self._cache.clear()
