"""The key-value cache of the batched Hugging Face runner, and the attention that reads it.

Every running row owns a *slot*: per layer, its keys and values for positions
``0 .. capacity-1``. One forward pass packs the new tokens of all rows into one
sequence (``[1, T]``, each token with its own row's position); the model runs as it
is, except for attention, which transformers lets us replace by name
(`transformers.AttentionInterface`): `slot_attention` writes the pass's new keys and
values into their rows' slots, then attends each query over its own row's slot.

Rows with few new tokens (decoding, drafts, short prompts) are attended together:
queries are scattered into a ``[slots, q, ...]`` block and scored against the slots as
they lie in memory, one batched matmul for the whole batch, with a mask that lets
query ``i`` of a row see its positions ``0 .. pos + i``. Rows with a long chunk (a
prompt being prefilled) are attended one by one. Nothing reads another row's slot, and
positions past a row's length are masked, so a row can roll back by forgetting its
last positions.

Keys are stored transposed (``[slots, kv_heads, head_dim, capacity]``): the scores of
a batch of single queries are then a plain batched matmul over contiguous rows, several
times faster on a CPU than against a transposed view of ``[.., capacity, head_dim]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface

#: the name under which `slot_attention` is registered with transformers
ATTENTION = "thinkgate_slots"

#: rows with at most this many new tokens in a pass are attended together
BATCHED_QUERY_MAX = 16


@dataclass(slots=True)
class PassLayout:
    """Where each token of one forward pass sits: built on the host by the runner, the
    tensors on the model's device. ``T`` tokens in all."""

    #: [T] slot and position of each token
    slot: torch.Tensor
    pos: torch.Tensor
    #: packed indices of the tokens attended together, their slot and their index
    #: within their row's new tokens ([Tb] each)
    b_tok: torch.Tensor | None
    b_slot: torch.Tensor | None
    b_qi: torch.Tensor | None
    #: [b_slots, b_queries]: query i of slot s sees positions < b_lim[s, i]
    b_lim: torch.Tensor | None
    b_slots: int
    b_queries: int
    b_len: int
    #: (slot, first packed token, end packed token, position of the first) of each row
    #: attended alone
    long_rows: list[tuple[int, int, int, int]]


class SlotKVCache:
    """Keys ``[slots, kv_heads, head_dim, capacity]`` and values ``[slots, kv_heads,
    capacity, head_dim]`` per layer. Slots and capacity grow on demand (doubling, the
    old contents copied), so memory follows the rows and lengths actually used."""

    def __init__(
        self,
        *,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        max_slots: int,
        slots: int = 8,
        capacity: int = 256,
    ) -> None:
        self.max_slots = max_slots
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.slots = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._heads = torch.arange(kv_heads, device=device)
        self._dims = torch.arange(head_dim, device=device)
        self._arange = torch.arange(0, device=device)
        self.ensure(min(slots, max_slots), capacity)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def ensure(self, slots: int, length: int) -> None:
        """Room for slots ``0 .. slots-1`` and positions ``0 .. length-1``. Fresh room
        is zero: masked positions must hold finite values (0 * inf is nan)."""
        if slots <= self.slots and length <= self.capacity:
            return
        if slots > self.max_slots:
            raise ValueError(f"slot {slots - 1} is past the cache's {self.max_slots} slots")
        new_slots = self.slots
        if slots > self.slots:
            new_slots = max(slots, min(2 * self.slots, self.max_slots))
        new_cap = self.capacity
        if length > self.capacity:
            new_cap = max(length, 2 * self.capacity)
            new_cap = -(-new_cap // 64) * 64
        s, c = self.slots, self.capacity
        h, d = self.kv_heads, self.head_dim
        keys, values = [], []
        for layer in range(self.layers):
            k = torch.zeros((new_slots, h, d, new_cap), dtype=self.dtype, device=self.device)
            v = torch.zeros((new_slots, h, new_cap, d), dtype=self.dtype, device=self.device)
            if s:
                k[:s, :, :, :c] = self.keys[layer]
                v[:s, :, :c] = self.values[layer]
            keys.append(k)
            values.append(v)
        self.keys, self.values = keys, values
        self.slots, self.capacity = new_slots, new_cap
        self._arange = torch.arange(new_cap, device=self.device)

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, at: PassLayout) -> None:
        """Store the pass's new ``key`` / ``value`` (``[1, kv_heads, T, head_dim]``) at
        their tokens' slots and positions."""
        k = key[0].transpose(0, 1)  # [T, h, d]
        v = value[0].transpose(0, 1)
        s, p = at.slot, at.pos
        heads = self._heads[None, :, None]
        self.keys[layer][s[:, None, None], heads, self._dims, p[:, None, None]] = k
        self.values[layer][s[:, None], self._heads[None, :], p[:, None]] = v

    def attend(
        self, layer: int, query: torch.Tensor, at: PassLayout, scaling: float
    ) -> torch.Tensor:
        """``[1, T, heads, head_dim]``: each query of ``query`` (``[1, heads, T,
        head_dim]``) attended over its row's positions up to its own."""
        heads, n, d = query.shape[1], query.shape[2], query.shape[3]
        h = self.kv_heads
        g = heads // h
        keys, values = self.keys[layer], self.values[layer]
        out = torch.empty((n, heads, d), dtype=query.dtype, device=query.device)
        qt = query[0].transpose(0, 1)  # [T, heads, d]
        if at.b_tok is not None:
            s, q, length = at.b_slots, at.b_queries, at.b_len
            block = torch.zeros((s, q, heads, d), dtype=query.dtype, device=query.device)
            block[at.b_slot, at.b_qi] = qt[at.b_tok]
            block = block.view(s, q, h, g, d).permute(0, 2, 3, 1, 4).reshape(s, h, g * q, d)
            scores = torch.matmul(block, keys[:s, :, :, :length]).mul_(scaling)
            hidden = self._arange[:length] >= at.b_lim[:, :, None]  # [s, q, length]
            scores.view(s, h, g, q, length).masked_fill_(hidden[:, None, None], float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
            res = torch.matmul(probs, values[:s, :, :length])  # [s, h, g*q, d]
            res = res.view(s, h, g, q, d).permute(0, 3, 1, 2, 4)  # [s, q, h, g, d]
            out[at.b_tok] = res[at.b_slot, at.b_qi].reshape(-1, heads, d)
        for slot, t0, t1, pos0 in at.long_rows:
            c = t1 - t0
            length = pos0 + c
            block = query[0, :, t0:t1].reshape(h, g * c, d)
            scores = torch.matmul(block, keys[slot, :, :, :length]).mul_(scaling)
            lim = torch.arange(pos0 + 1, length + 1, device=query.device)
            hidden = self._arange[:length] >= lim[:, None]  # [c, length]
            scores.view(h, g, c, length).masked_fill_(hidden, float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
            res = torch.matmul(probs, values[slot, :, :length])  # [h, g*c, d]
            out[t0:t1] = res.view(h, g, c, d).permute(2, 0, 1, 3).reshape(c, heads, d)
        return out.unsqueeze(0)


class SlotAttentionError(RuntimeError):
    pass


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The attention function transformers calls in each layer (registered as
    `ATTENTION`): the pass's cache and layout come in the ``thinkgate_pass`` keyword
    argument of the model's forward."""
    cache, at = kwargs.get("thinkgate_pass") or (None, None)
    if cache is None:
        raise SlotAttentionError(
            f"the {ATTENTION!r} attention needs the batched runner's thinkgate_pass argument"
        )
    if kwargs.get("sliding_window") is not None:
        raise SlotAttentionError("sliding-window attention is not supported")
    layer = module.layer_idx
    cache.write(layer, key, value, at)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return cache.attend(layer, query, at, scaling), None


AttentionInterface.register(ATTENTION, slot_attention)
