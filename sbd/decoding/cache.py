"""A preallocated KV cache: writes in place, crops by moving a length, never copies per forward.

Transformers' DynamicCache concatenates the whole cache on every forward; SBD also needs to drop the
block's scratch entries after every forward. Here each layer owns a buffer sized for prompt + budget +
one block, `update` writes the new keys/values after the current length and returns a view, and
`crop` only moves the length back, so the next forward overwrites the scratch entries.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ..models.slab import SlabLayer, slab_cache  # noqa: F401 (the one-length cache, used with crop below)
from ..models.slab import kv_buffers as _buffers


def crop(cache: Cache, n: int) -> None:
    """Drop the last `n` positions of every layer (the scratch entries of a block)."""
    if n:
        for layer in cache.layers:
            layer.crop(-n)


def select_rows(cache: Cache, rows: torch.Tensor) -> None:
    """Keep only `rows` of the batch (called when rows finish, not per forward)."""
    for layer in cache.layers:
        layer.batch_select_indices(rows)


class SlotLayer(DynamicLayer):
    """One layer's keys/values for the per-row engine: `slots` rows of `capacity` positions each, plus
    `trash` positions at the end of every row where padding tokens write (nobody reads them).

    Each row has its own length; the engine says, per forward, which slots take part (`lo:hi`), where each
    input column writes (`write_at`, (B, W) device positions) and how many positions the forward sees
    (`visible`: the longest row's end, or the whole capacity for fixed shapes)."""

    def __init__(self, slots: int, capacity: int, trash: int, static: bool = False):
        super().__init__()
        self.slots, self.capacity, self.trash, self.static = slots, capacity, trash, static
        self.lo = self.hi = self.visible = 0
        self.write_at: torch.Tensor | None = None
        self.write_from: int | None = None  # all rows write columns write_from … (one length, no padding)

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k, self._v = _buffers(key_states, value_states, self.slots, self.capacity + self.trash, zeros=True,
                                    static=self.static)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        k, v = self._k[self.lo : self.hi], self._v[self.lo : self.hi]
        if self.write_from is not None:  # the same positions as write_at, as one slice
            width = key_states.shape[2]
            k[:, :, self.write_from : self.write_from + width].copy_(key_states)
            v[:, :, self.write_from : self.write_from + width].copy_(value_states)
            return k[:, :, : self.visible], v[:, :, : self.visible]
        at = self.write_at[:, None, :, None]
        k.scatter_(2, at.expand_as(key_states), key_states)
        v.scatter_(2, at.expand(-1, value_states.shape[1], -1, value_states.shape[-1]), value_states)
        return k[:, :, : self.visible], v[:, :, : self.visible]

    @property
    def keys(self):
        return self._k[self.lo : self.hi, :, : self.visible] if self.is_initialized else None

    @keys.setter
    def keys(self, value):
        pass

    @property
    def values(self):
        return self._v[self.lo : self.hi, :, : self.visible] if self.is_initialized else None

    @values.setter
    def values(self, value):
        pass

    def get_seq_length(self) -> int:
        return self.visible

    def swap(self, i: int, j: int, length_i: int, length_j: int) -> None:
        """Exchange the first `length_i` positions of slot i with the first `length_j` of slot j (two rows
        change places; a slot with nothing committed is only overwritten)."""
        if not self.is_initialized or not (length_i or length_j):
            return
        if not length_i or not length_j:  # one side holds nothing: a move
            src, dst, n = (j, i, length_j) if length_j else (i, j, length_i)
            self._k[dst, :, :n] = self._k[src, :, :n]
            self._v[dst, :, :n] = self._v[src, :, :n]
            return
        n = max(length_i, length_j)
        for buf in (self._k, self._v):
            held = buf[i, :, :n].clone()
            buf[i, :, :n] = buf[j, :, :n]
            buf[j, :, :n] = held


    def compact(self, slot: int, start: int, keep: torch.Tensor) -> None:
        """Slot-local: the keys/values at start + keep[0], start + keep[1], … (increasing offsets, a device
        tensor) move to start, start + 1, … — the path a tree draft kept, made contiguous and in order."""
        if not self.is_initialized:
            return
        src = keep + start
        for buf in (self._k, self._v):
            buf[slot, :, start : start + len(keep)] = buf[slot].index_select(1, src)  # gathered, then written


def slot_cache(model, slots: int, capacity: int, trash: int, static: bool = False) -> Cache:
    """A per-row cache for `model`: `slots` rows of `capacity` positions (see `SlotLayer`)."""
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[SlotLayer(slots, capacity, trash, static) for _ in range(n_layers)])
