"""A model whose intended continuation a test controls.

The script is a JSON file: ``{"rules": [{"match": TEXT, "output": TEXT}, ...],
"default": TEXT}``. A request follows the output of the first rule whose ``match``
occurs in its decoded prompt (else ``default``); special-token strings in an output
(``<think>``, ``<tool_call>``) are their single ids. At each position the scripted
token gets a large logit over a random background, so the model writes its script
whenever the grammar allows it, and something else allowed (random, with the
closing bias) where the grammar repairs it. After the script: end of sequence.

The model follows its script by text, not by position, as long as its output is a
prefix of the script's text: at a token boundary of the script it wants the script's
next token; inside one (the output was split otherwise, by jump forward, say) the first
token of the rest of the script, encoded afresh. An output that left the script's text
(the grammar repaired it) goes on with the script's token at its position.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..model_options import ScriptedOptions
from .base import ForwardBatch, ModelRunner, RunnerOptions, RunnerRow, closing_bias, logit_positions
from .random_logits import POOL_ROWS, _mix

SCRIPT_BONUS = 40.0


class ScriptedRunner(ModelRunner):
    Options = ScriptedOptions
    own: ScriptedOptions
    #: drafts get logits as if the row had written them; nothing is held per position
    multi_token = True

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
        self._scripts: dict[str, _Script] = {}

    def script_for(self, prompt_token_ids: Sequence[int]) -> list[int]:
        text = self.tokenizer.decode(prompt_token_ids)
        for match, output in self._rules:
            if match in text:
                return output
        return self._default

    def _script(self, row: RunnerRow) -> _Script:
        sc = self._scripts.get(row.request_id)
        if sc is None:
            sc = self._scripts[row.request_id] = _Script(
                self.script_for(row.prompt_token_ids), self.tokenizer
            )
        return sc

    def add(self, row: RunnerRow) -> None:
        self._script(row)

    def remove(self, row: RunnerRow) -> None:
        self._scripts.pop(row.request_id, None)

    def rollback(self, row: RunnerRow, k: int) -> None:
        """Nothing to forget: logits depend on the row's known tokens alone."""

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        at = logit_positions(batch)
        n = len(at)
        if n > self._out.shape[0]:  # drafts: several rows of logits per request
            self._out = torch.empty((n, self.vocab_rows), dtype=torch.float32, device=self.device)
        idx = torch.tensor(
            [_mix(r.model_seed, len(r.output_ids) + len(a)) % POOL_ROWS for r, a in at]
        )
        out = self._out[:n]
        torch.index_select(self._pool, 0, idx.to(self.device), out=out)
        want = [
            self._script(r).want(
                _Ahead(r.output_ids, a) if a else r.output_ids, self._eos, len(r.output_ids)
            )
            for r, a in at
        ]
        out[torch.arange(n, device=self.device), torch.tensor(want, device=self.device)] += (
            SCRIPT_BONUS
        )
        if self.own.forward_ms > 0:
            time.sleep(self.own.forward_ms / 1000)
        return out


class _Ahead(Sequence[int]):
    """A row's output followed by draft tokens, without copying the output."""

    __slots__ = ("out", "ahead")

    def __init__(self, out: Sequence[int], ahead: Sequence[int]) -> None:
        self.out, self.ahead = out, ahead

    def __len__(self) -> int:
        return len(self.out) + len(self.ahead)

    def __getitem__(self, i):  # int indices only (`_Script.want`)
        n = len(self.out)
        return self.out[i] if i < n else self.ahead[i - n]


class _Script:
    """One request's script and how far its output follows the script's text."""

    __slots__ = ("ids", "data", "tokenizer", "_starts", "_ends", "_toks", "_final", "_aligned")

    def __init__(self, ids: list[int], tokenizer) -> None:
        self.ids = ids
        self.tokenizer = tokenizer
        self.data = tokenizer.decode_bytes(ids)
        #: byte offset where each script token starts -> its index
        self._starts: dict[int, int] = {}
        at = 0
        for i, t in enumerate(ids):
            self._starts.setdefault(at, i)
            at += len(tokenizer.token_bytes(t))
        #: per output token: the byte offset after it while the output follows the
        #: script's text (the list stops growing where it leaves it)
        self._ends: list[int] = []
        #: the token each entry of ``_ends`` was computed for, and how many of them are
        #: the row's final output (the rest were drafts, which may differ next time)
        self._toks: list[int] = []
        self._final = 0
        self._aligned = True

    def want(self, output_ids: Sequence[int], eos: int, final: int | None = None) -> int:
        """The token the script wants after ``output_ids``, whose first ``final``
        tokens (default: all) are the row's output, the rest drafts."""
        ends, toks, n = self._ends, self._toks, len(output_ids)
        p, m = self._final, min(len(toks), n)
        while p < m and toks[p] == output_ids[p]:
            p += 1
        del ends[p:], toks[p:]  # what drafts (or rolled back tokens) left
        self._aligned = True  # found again below, by at most one token
        while self._aligned and len(ends) < n:
            at = ends[-1] if ends else 0
            b = self.tokenizer.token_bytes(output_ids[len(ends)])
            if self.data[at : at + len(b)] != b:
                self._aligned = False
                break
            ends.append(at + len(b))
            toks.append(output_ids[len(toks)])
        self._final = min(n if final is None else final, len(toks))
        if not self._aligned:
            return self.ids[n] if n < len(self.ids) else eos
        at = ends[-1] if ends else 0
        if at >= len(self.data):
            return eos
        i = self._starts.get(at)
        if i is not None:
            return self.ids[i]
        rest = self.data[at:].decode("utf-8", errors="ignore")
        fresh = self.tokenizer.encode(rest) if rest else []
        return fresh[0] if fresh else (self.ids[n] if n < len(self.ids) else eos)
