"""A preallocated KV cache: writes in place, crops by moving a length, never copies per forward.

Transformers' DynamicCache concatenates the whole cache on every forward; SBD also needs to drop the
block's scratch entries after every forward. Here each layer owns a buffer sized for prompt + budget +
one block, `update` writes the new keys/values after the current length and returns a view, and
`crop` only moves the length back, so the next forward overwrites the scratch entries.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class SlabLayer(DynamicLayer):
    """One layer's keys/values in a fixed-capacity buffer of shape (B, heads, capacity, head_dim)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self._k = key_states.new_empty((b, h, self.capacity, d))
        self._v = value_states.new_empty((b, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: {end} > capacity {self.capacity}")
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]

    @property
    def keys(self):
        return self._k[:, :, : self.length] if self.is_initialized else None

    @keys.setter
    def keys(self, value):  # DynamicLayer.__init__/reset assign these; the buffers are ours
        pass

    @property
    def values(self):
        return self._v[:, :, : self.length] if self.is_initialized else None

    @values.setter
    def values(self, value):
        pass

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` positions (transformers 5 convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of positions to drop")
        self.length = max(0, self.length + tokens_to_remove)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k = self._k[indices]
            self._v = self._v[indices]


def slab_cache(model, capacity: int) -> Cache:
    """A cache for `model` holding at most `capacity` positions per row."""
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[SlabLayer(capacity) for _ in range(n_layers)])


def cache_length(cache: Cache) -> int:
    return cache.layers[0].get_seq_length()


def crop(cache: Cache, n: int) -> None:
    """Drop the last `n` positions of every layer (the scratch entries of a block)."""
    if n:
        for layer in cache.layers:
            layer.crop(-n)


def select_rows(cache: Cache, rows: torch.Tensor) -> None:
    """Keep only `rows` of the batch (called when rows finish, not per forward)."""
    for layer in cache.layers:
        layer.batch_select_indices(rows)
