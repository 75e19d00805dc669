"""The memory floor of a forward: the bytes it must read, over the machine's read bandwidth.

At small batch a decoding forward reads every weight once (and the KV cache it attends to) and does little
arithmetic per byte, so no kernel can run it faster than bytes / bandwidth. The bytes are those of the
model as loaded: float32, bfloat16, or quantized layers with their scales (`sbd.models.quantized`), which
is what makes quantized weights pay. The input embeddings are left out (a forward reads only its tokens'
rows) unless the output layer shares them. `sbd forward-cost` reports each measured forward against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .hardware import _median_seconds
from .roofline import ModelShape


@dataclass(frozen=True)
class Floor:
    """weight_bytes: read by every forward; kv_bytes_per_position: one cached position of one row (keys
    and values, every layer); bandwidth: bytes/s a large read runs at here."""

    weight_bytes: int
    kv_bytes_per_position: int
    bandwidth: float

    def seconds(self, batch: int, cached: int, width: int) -> float:
        """The least time a forward of `width` new tokens per row over `cached` positions can take."""
        return (self.weight_bytes + batch * (cached + width) * self.kv_bytes_per_position) / self.bandwidth


def weight_bytes(model) -> int:
    """Bytes of the parameters and buffers a forward reads: each tensor once (shared ones too), without the
    input embedding matrix unless the output layer reads it (tied embeddings)."""
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and getattr(output, "weight", None) is embedding
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t is embedding and not tied:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def kv_bytes_per_position(model) -> int:
    """Bytes of one cached position of one row: keys and values of every layer, in the model's dtype."""
    m = ModelShape.from_config(model.config)
    return 2 * m.layers * m.kv_heads * m.head_dim * model.get_input_embeddings().weight.element_size()


def read_bandwidth(device: str | torch.device = "cpu", mib: int | None = None, repeats: int = 5) -> float:
    """Bytes/s of summing a tensor far larger than any cache (default 512 MiB on a CPU, 2 GiB on a GPU):
    the rate at which the weights can stream in. The median of `repeats` after one warm-up."""
    dev = torch.device(device)
    size = (mib or (512 if dev.type == "cpu" else 2048)) * 2 ** 20
    x = torch.ones(size // 4, dtype=torch.float32, device=dev)
    return size / _median_seconds(x.sum, dev, repeats)


def floor_of(model, bandwidth: float | None = None) -> Floor:
    """The floor of `model` on its device (bandwidth measured when not given)."""
    device = model.get_input_embeddings().weight.device
    return Floor(weight_bytes(model), kv_bytes_per_position(model),
                 bandwidth if bandwidth is not None else read_bandwidth(device))
