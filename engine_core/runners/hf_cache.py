"""The key-value cache of the batched Hugging Face runner, and the attention that reads it.

Every running row owns a *slot*: per layer, its keys and values for positions
``0 .. capacity-1``. One forward pass packs the new tokens of all rows into one
sequence (``[1, T]``, each token with its own row's position); the model runs as it
is, except for attention, which transformers lets us replace by name
(`transformers.AttentionInterface`): `slot_attention` writes the pass's new keys and
values into their rows' slots, then attends each query over its own row's slot.

Rows are attended in groups, one batched computation each: a group's queries are
scattered into a ``[rows, q, ...]`` block and scored against its rows' keys, with a mask
that lets query ``i`` of a row see its positions ``0 .. pos + i``. Rows with few new
tokens (decoding, drafts, short appended runs) form one group read in place: the block
is indexed by slot, and the slots are scored as they lie in memory, so nothing is
copied. Rows with longer chunks (prompts being prefilled) are grouped by size (up to 32,
64, 128, ... new tokens) and their slots gathered, a copy that costs less than their
attention. Nothing reads another row's slot, and positions past a row's length are
masked, so a row can roll back by forgetting its last positions.

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

#: rows with at most this many new tokens in a pass are attended in place, together
IN_PLACE_QUERY_MAX = 16


@dataclass(slots=True)
class QueryGroup:
    """Rows attended in one batched computation: their queries scattered into a block
    of ``[rows, queries]``, scored against the rows' keys up to ``length``."""

    #: packed indices of the group's tokens; for each, its row in the block and its
    #: index among its row's new tokens ([Tg] each)
    tok: torch.Tensor
    row: torch.Tensor
    qi: torch.Tensor
    #: [rows, queries]: query i of block row r sees positions < lim[r, i]
    lim: torch.Tensor
    rows: int
    queries: int
    length: int
    #: [rows] the slot of each block row; None: block row r is slot r, read in place
    slots: torch.Tensor | None


@dataclass(slots=True)
class PassLayout:
    """Where each token of one forward pass sits: built on the host by the runner, the
    tensors on the model's device. ``T`` tokens in all."""

    #: [T] slot and position of each token
    slot: torch.Tensor
    pos: torch.Tensor
    groups: list[QueryGroup]
    #: where the tokens' keys and values go in a layer's flattened cache (set by the
    #: first layer's `SlotKVCache.write`, used by every layer)
    key_at: torch.Tensor | None = None
    value_at: torch.Tensor | None = None


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
        their tokens' slots and positions: one ``index_copy_`` each into the layer's
        cache seen flat."""
        h, d, cap = self.kv_heads, self.head_dim, self.capacity
        if at.key_at is None:  # flat offsets, the same in every layer
            row = (at.slot[:, None] * h + self._heads) * cap  # [T, h]
            at.value_at = (row + at.pos[:, None]).reshape(-1)  # rows of [S*h*cap, d]
            # keys are [S, h, d, cap]: ((slot*h + head)*d + dim)*cap + pos
            key_at = row[:, :, None] * d + self._dims * cap + at.pos[:, None, None]
            at.key_at = key_at.reshape(-1)
        self.values[layer].view(-1, d).index_copy_(
            0, at.value_at, value[0].transpose(0, 1).reshape(-1, d)
        )
        self.keys[layer].view(-1).index_copy_(0, at.key_at, key[0].transpose(0, 1).reshape(-1))

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
        for grp in at.groups:
            s, q, length = grp.rows, grp.queries, grp.length
            if grp.slots is None:
                k, v = keys[:s, :, :, :length], values[:s, :, :length]
            else:
                k = keys[:, :, :, :length].index_select(0, grp.slots)
                v = values[:, :, :length].index_select(0, grp.slots)
            block = torch.zeros((s, q, heads, d), dtype=query.dtype, device=query.device)
            block[grp.row, grp.qi] = qt[grp.tok]
            block = block.view(s, q, h, g, d).permute(0, 2, 3, 1, 4).reshape(s, h, g * q, d)
            scores = torch.matmul(block, k).mul_(scaling)  # [s, h, g*q, length]
            hidden = self._arange[:length] >= grp.lim[:, :, None]  # [s, q, length]
            scores.view(s, h, g, q, length).masked_fill_(hidden[:, None, None], float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
            res = torch.matmul(probs, v)  # [s, h, g*q, d]
            res = res.view(s, h, g, q, d).permute(0, 3, 1, 2, 4)  # [s, q, h, g, d]
            out[grp.tok] = res[grp.row, grp.qi].reshape(-1, heads, d)
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
