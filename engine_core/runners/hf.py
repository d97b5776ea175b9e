"""A Hugging Face causal LM from a local directory, run as one batch.

Every step is one forward pass over the whole running batch: each decoding row feeds
its new tokens (one after a sampled step, several after appended tokens, plus any
drafts), and rows still prefilling their prompt feed a chunk of it within a token
budget (``max_num_batched_tokens``, decoding rows first), so that a long prompt does
not stall the others. Every row keeps its keys and values in its own slot of a
`SlotKVCache`; rows join and leave at any step without touching the others' slots.

transformers supplies the model, its weights and every layer but attention, which
`hf_cache.slot_attention` replaces (through transformers' attention interface): the
model's own code runs, so any decoder-only architecture that uses that interface
(Llama, Qwen2/3, Mistral without a sliding window, ...) works unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .base import ForwardBatch, ModelRunner, RunnerOptions, RunnerRow
from .hf_cache import ATTENTION, IN_PLACE_QUERY_MAX, PassLayout, QueryGroup, SlotKVCache

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}

#: config fields that make logits more than ``hidden @ lm_head.T`` (when not neutral)
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use auto or one of {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass(slots=True)
class _Row:
    slot: int
    #: positions held in the slot: the row's first ``cached`` tokens
    cached: int = 0


class HFRunner(ModelRunner):
    """Loads ``path`` with transformers (``local_files_only``: nothing is downloaded)."""

    multi_token = True

    def __init__(self, tokenizer, options: RunnerOptions, path: str) -> None:
        super().__init__(tokenizer, options)
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no bars on the engine's stderr

        if not Path(path, "config.json").is_file():
            raise FileNotFoundError(f"{path!r} is not a model directory (no config.json)")
        if options.max_num_batched_tokens < options.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({options.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({options.max_num_seqs}): every decoding row feeds a token"
            )
        self.dtype = resolve_dtype(options.dtype, self.device)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        _check_supported(config, path)
        torch.manual_seed(options.seed)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=self.dtype)
        if not getattr(model, "_supports_attention_backend", False):
            raise ValueError(
                f"{type(model).__name__} does not run its attention through transformers' "
                "attention interface: the batched runner cannot drive it"
            )
        model.set_attn_implementation(ATTENTION)
        self.model = model.to(self.device).eval()
        self.base = model.base_model
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output embeddings (lm_head)")
        self._head_weight = head.weight
        self._head_bias = getattr(head, "bias", None)
        rows = int(model.config.vocab_size)
        if rows < tokenizer.num_tokens:
            raise ValueError(
                f"model has {rows} vocabulary rows, its tokenizer {tokenizer.num_tokens} tokens"
            )
        self.vocab_rows = rows
        cfg = model.config.get_text_config()
        heads = cfg.num_attention_heads
        self.cache = SlotKVCache(
            layers=cfg.num_hidden_layers,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            dtype=self.dtype,
            device=self.device,
            max_slots=options.max_num_seqs,
        )
        self._rows: dict[int, _Row] = {}  # id(row) -> its slot and length
        self._free: list[int] = []  # freed slots, a heap: the lowest is reused first
        self._next_slot = 0
        self._out = torch.empty(
            (options.max_num_seqs, rows), dtype=torch.float32, device=self.device
        )

    # ----- rows in and out ---------------------------------------------------------

    def add(self, row: RunnerRow) -> None:
        if self._free:
            slot = heapq.heappop(self._free)
        else:
            slot = self._next_slot
            self._next_slot += 1
        self._rows[id(row)] = _Row(slot)

    def remove(self, row: RunnerRow) -> None:
        st = self._rows.pop(id(row), None)
        if st is not None:
            heapq.heappush(self._free, st.slot)

    def rollback(self, row: RunnerRow, k: int) -> None:
        st = self._rows[id(row)]
        if not 0 <= k <= st.cached:
            raise ValueError(f"cannot roll back {k} of the {st.cached} positions held")
        st.cached -= k

    def held(self, row: RunnerRow) -> int:
        """Positions the cache holds for ``row``."""
        return self._rows[id(row)].cached

    # ----- one step ----------------------------------------------------------------

    def plan(
        self, rows: Sequence[RunnerRow], drafts: Sequence[Sequence[int]] | None = None
    ) -> ForwardBatch:
        """Decoding rows feed all their unseen tokens (and drafts); what is left of the
        token budget goes to rows prefilling their prompt, first come first served. A
        prefilling row is ready once this pass reaches the end of its prompt."""
        n = len(rows)
        if drafts is not None and len(drafts) != n:
            raise ValueError(f"{len(drafts)} drafts for {n} rows")
        feed = [0] * n
        prefilling: list[int] = []
        used = 0
        for i, r in enumerate(rows):
            st = self._rows[id(r)]
            unseen = len(r.prompt_token_ids) + len(r.output_ids) - st.cached
            if unseen <= 0:  # nothing new: feed the last token again for its logits
                st.cached -= 1
                unseen = 1
            if st.cached >= len(r.prompt_token_ids):
                feed[i] = unseen
                used += unseen + (len(drafts[i]) if drafts is not None else 0)
            else:
                prefilling.append(i)
        if not prefilling:
            return ForwardBatch(rows, drafts=drafts, feed=feed)
        # at least one token, so that prefilling goes on whatever the drafts take
        left = max(1, self.options.max_num_batched_tokens - used)
        waiting: set[int] = set()
        for i in prefilling:
            r = rows[i]
            unseen = len(r.prompt_token_ids) + len(r.output_ids) - self._rows[id(r)].cached
            feed[i] = min(unseen, left)
            left -= feed[i]
            if feed[i] < unseen:
                waiting.add(i)
                if drafts is not None and drafts[i]:
                    raise ValueError("a row still prefilling its prompt takes no drafts")
        ready = [i for i in range(n) if i not in waiting] if waiting else None
        return ForwardBatch(rows, ready=ready, drafts=drafts, feed=feed)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if batch.feed is None:
            batch = self.plan(batch.rows, batch.drafts)
        ids, layout, logit_at = self._layout(batch)
        hidden = self.base(
            input_ids=ids[None],
            position_ids=layout.pos[None],
            use_cache=False,
            thinkgate_pass=(self.cache, layout),
        ).last_hidden_state[0]
        picked = hidden.index_select(0, logit_at)
        n = picked.shape[0]
        if n > self._out.shape[0]:
            self._out = torch.empty((n, self.vocab_rows), dtype=torch.float32, device=self.device)
        out = self._out[:n]
        if picked.dtype == torch.float32:
            torch.matmul(picked, self._head_weight.t(), out=out)
        else:
            out.copy_(torch.matmul(picked, self._head_weight.t()))
        if self._head_bias is not None:
            out += self._head_bias.float()
        return out

    def _layout(self, batch: ForwardBatch) -> tuple[torch.Tensor, PassLayout, torch.Tensor]:
        """The pass's packed token ids, their layout and the packed indices whose hidden
        states give logits; advances each row's held length. The index lists go to the
        device as one tensor."""
        rows, drafts, feed = batch.rows, batch.drafts, batch.feed
        assert feed is not None
        states = self._rows
        if drafts is None and batch.ready is None and feed.count(1) == len(feed):
            sts = [states[id(r)] for r in rows]
            if all(st.cached >= len(r.prompt_token_ids) for st, r in zip(sts, rows, strict=True)):
                return self._decode_layout(rows, sts)
        ready = None if batch.ready is None else set(batch.ready)
        ids: list[int] = []
        slots: list[int] = []
        pos: list[int] = []
        logit_at: list[int] = []
        # group key (0: in place; else the block's query size) -> the rows' (slot,
        # first packed token, new tokens)
        groups: dict[int, list[tuple[int, int, int]]] = {}
        top_len = 0
        ahead: list[range] = []  # per ready row with drafts: the packed indices of them
        for i, r in enumerate(rows):
            st = states[id(r)]
            p0, f, slot = st.cached, feed[i], st.slot
            plen = len(r.prompt_token_ids)
            d = drafts[i] if drafts is not None else ()
            t0 = len(ids)
            if p0 + f <= plen:
                ids += r.prompt_token_ids[p0 : p0 + f]
            else:
                if p0 < plen:
                    ids += r.prompt_token_ids[p0:]
                ids += r.output_ids[max(0, p0 - plen) : p0 + f - plen]
            ids += d
            c = len(ids) - t0
            if not c:
                continue
            st.cached = p0 + c
            slots += [slot] * c
            pos += range(p0, p0 + c)
            top_len = max(top_len, p0 + c)
            if ready is None or i in ready:
                logit_at.append(len(ids) - 1 - len(d))
                ahead.append(range(len(ids) - len(d), len(ids)))
            key = 0 if c <= IN_PLACE_QUERY_MAX else max(32, 1 << (c - 1).bit_length())
            groups.setdefault(key, []).append((slot, t0, c))
        if drafts is not None:  # position by position (`ForwardBatch`)
            top = max(map(len, ahead), default=0)
            logit_at += [a[j] for j in range(top) for a in ahead if j < len(a)]
        self.cache.ensure(max(slots, default=-1) + 1, top_len)
        # one host list, one copy to the device: ids, slots, positions, logit rows,
        # then per group its tokens, block rows, query indices (and gathered slots)
        host = ids + slots + pos + logit_at
        n = len(ids)
        spans = []
        for key, members in groups.items():
            tok: list[int] = []
            row: list[int] = []
            qi: list[int] = []
            for j, (slot, t0, c) in enumerate(members):
                tok += range(t0, t0 + c)
                row += [slot if key == 0 else j] * c
                qi += range(c)
            spans.append((key, members, len(host), len(tok)))
            host += tok + row + qi + ([] if key == 0 else [m[0] for m in members])
        packed = torch.tensor(host, dtype=torch.long).to(self.device, non_blocking=True)
        pos_t = packed[2 * n : 3 * n]
        layout = PassLayout(slot=packed[n : 2 * n], pos=pos_t, groups=[])
        for key, members, at, m in spans:
            tok_t = packed[at : at + m]
            row_t = packed[at + m : at + 2 * m]
            qi_t = packed[at + 2 * m : at + 3 * m]
            rows_n = max(slot for slot, _, _ in members) + 1 if key == 0 else len(members)
            queries = max(c for _, _, c in members)
            lim = torch.ones((rows_n, queries), dtype=torch.long, device=self.device)
            lim[row_t, qi_t] = pos_t[tok_t] + 1  # padding queries see position 0
            length = max(p + c for p, c in ((pos[t0], c) for _, t0, c in members))
            gathered = None if key == 0 else packed[at + 3 * m : at + 3 * m + len(members)]
            layout.groups.append(
                QueryGroup(tok_t, row_t, qi_t, lim, rows_n, queries, length, gathered)
            )
        return packed[:n], layout, packed[3 * n : 3 * n + len(logit_at)]

    def _decode_layout(
        self, rows: Sequence[RunnerRow], sts: list[_Row]
    ) -> tuple[torch.Tensor, PassLayout, torch.Tensor]:
        """`_layout` of a pass in which every row decodes one token (the steady state),
        with a few list comprehensions instead of the general per-row loop."""
        n = len(rows)
        pos = [st.cached for st in sts]
        ids = [r.output_ids[p - len(r.prompt_token_ids)] for r, p in zip(rows, pos, strict=True)]
        slots = [st.slot for st in sts]
        for st in sts:
            st.cached += 1
        top_slot, top_len = max(slots) + 1, max(pos) + 1
        self.cache.ensure(top_slot, top_len)
        packed = torch.tensor(ids + slots + pos, dtype=torch.long).to(
            self.device, non_blocking=True
        )
        slot_t, pos_t = packed[n : 2 * n], packed[2 * n :]
        at = torch.arange(n, device=self.device)
        lim = torch.ones((top_slot, 1), dtype=torch.long, device=self.device)
        lim[slot_t, 0] = pos_t + 1
        zeros = torch.zeros(n, dtype=torch.long, device=self.device)
        group = QueryGroup(at, slot_t, zeros, lim, top_slot, 1, top_len, None)
        layout = PassLayout(slot=slot_t, pos=pos_t, groups=[group])
        return packed[:n], layout, at

    def close(self) -> None:
        self._rows.clear()
        self.cache.keys.clear()
        self.cache.values.clear()


def _check_supported(config, path: str) -> None:
    """Refuse, with the reason, a model whose forward pass this runner would get wrong."""
    text = config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(
            f"{path}: layers of kind {', '.join(sorted(kinds - {'full_attention'}))} are not "
            "supported by the batched runner (full attention only)"
        )
    window = getattr(text, "sliding_window", None)
    if window is not None and getattr(text, "use_sliding_window", True):
        raise ValueError(f"{path}: sliding-window attention is not supported")
    for name in _LOGIT_TRANSFORMS:
        v = getattr(text, name, None)
        if v not in (None, 1, 1.0):
            raise ValueError(f"{path}: {name}={v} is not supported (logits must be a plain head)")
