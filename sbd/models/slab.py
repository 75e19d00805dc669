"""A KV cache with one length for all rows, in a buffer allocated once: the conformance probe, the
convergence check and forward-cost timing use it. The decoding engine's per-row cache
(`sbd.decoding.cache`) allocates its buffers the same way (`kv_buffers`).

`update` writes the new keys/values after the current length and returns a view; `crop` only moves the
length back, so the next forward overwrites what was dropped.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


def kv_buffers(key_states, value_states, rows: int, positions: int, zeros: bool, static: bool = False):
    """Key and value buffers of (rows, heads, positions, head_dim). zeros: positions a mask hides still
    enter the attention product as 0·v, so they must not hold NaN; static: fixed addresses (a captured
    CUDA graph may write into them in place)."""
    new_k = key_states.new_zeros if zeros else key_states.new_empty
    new_v = value_states.new_zeros if zeros else value_states.new_empty
    k = new_k((rows, key_states.shape[1], positions, key_states.shape[-1]))
    v = new_v((rows, value_states.shape[1], positions, value_states.shape[-1]))
    if static:
        torch._dynamo.mark_static_address(k)
        torch._dynamo.mark_static_address(v)
    return k, v


class SlabLayer(DynamicLayer):
    """One layer's keys/values in a fixed-capacity buffer of shape (B, heads, capacity, head_dim), one
    length for all rows (the probe, the convergence check and forward-cost timing use it)."""

    def __init__(self, capacity: int, static: bool = False):
        super().__init__()
        self.capacity, self.static = capacity, static
        self.length = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k, self._v = kv_buffers(key_states, value_states, key_states.shape[0], self.capacity, zeros=False,
                                      static=self.static)
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


def slab_cache(model, capacity: int, static: bool = False) -> Cache:
    """A cache for `model` holding at most `capacity` positions per row, one length for all rows (static:
    at fixed addresses, for a compiled forward that CUDA graphs replay)."""
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[SlabLayer(capacity, static) for _ in range(n_layers)])
