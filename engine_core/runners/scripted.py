"""A model whose intended continuation a test controls.

The script is a JSON file: ``{"rules": [{"match": TEXT, "output": TEXT}, ...],
"default": TEXT}``. A request follows the output of the first rule whose ``match``
occurs in its decoded prompt (else ``default``); special-token strings in an output
(``<think>``, ``<tool_call>``) are their single ids. At each position the scripted
token gets a large logit over a random background, so the model writes its script
whenever the grammar allows it, and something else allowed (random, with the
closing bias) where the grammar repairs it. After the script: end of sequence.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..model_options import ScriptedOptions
from .base import ModelRunner, RunnerOptions, RunnerRow, closing_bias
from .random_logits import POOL_ROWS, _mix

SCRIPT_BONUS = 40.0


class ScriptedRunner(ModelRunner):
    Options = ScriptedOptions
    own: ScriptedOptions

    def __init__(self, tokenizer, options: RunnerOptions) -> None:
        super().__init__(tokenizer, options)
        script = {"rules": [], "default": ""}
        if self.own.script:
            path = Path(self.own.script)
            if not path.is_file():
                raise FileNotFoundError(f"script file {self.own.script!r} does not exist")
            script = json.loads(path.read_text(encoding="utf-8"))
        self._rules = [
            (str(r["match"]), tokenizer.encode(str(r["output"]))) for r in script.get("rules", [])
        ]
        self._default = tokenizer.encode(str(script.get("default", "")))
        if tokenizer.eos_token_id is None:
            raise ValueError("the scripted model needs a vocabulary with an end-of-sequence token")
        self._eos = tokenizer.eos_token_id
        rng = np.random.default_rng(options.seed)
        pool = rng.standard_normal((POOL_ROWS, self.vocab_rows), dtype=np.float32)
        pool += closing_bias(tokenizer, self.own.closing_bias)
        self._pool = torch.from_numpy(pool).to(self.device)
        self._out = torch.empty(
            (options.max_num_seqs, self.vocab_rows), dtype=torch.float32, device=self.device
        )
        self._scripts: dict[str, list[int]] = {}

    def script_for(self, prompt_token_ids: Sequence[int]) -> list[int]:
        text = self.tokenizer.decode(prompt_token_ids)
        for match, output in self._rules:
            if match in text:
                return output
        return self._default

    def add(self, row: RunnerRow) -> None:
        self._scripts[row.request_id] = self.script_for(row.prompt_token_ids)

    def remove(self, row: RunnerRow) -> None:
        self._scripts.pop(row.request_id, None)

    def forward(self, rows: Sequence[RunnerRow]) -> torch.Tensor:
        n = len(rows)
        idx = torch.tensor([_mix(r.model_seed, len(r.output_ids)) % POOL_ROWS for r in rows])
        out = self._out[:n]
        torch.index_select(self._pool, 0, idx.to(self.device), out=out)
        want = []
        for r in rows:
            script = self._scripts.get(r.request_id)
            if script is None:
                script = self._scripts[r.request_id] = self.script_for(r.prompt_token_ids)
            pos = len(r.output_ids)
            want.append(script[pos] if pos < len(script) else self._eos)
        out[torch.arange(n, device=self.device), torch.tensor(want, device=self.device)] += (
            SCRIPT_BONUS
        )
        if self.own.forward_ms > 0:
            time.sleep(self.own.forward_ms / 1000)
        return out
