"""The roofline constants of the machine at hand, measured: achievable matmul FLOP/s and copy
bandwidth. A roofline built from them tells what the model's forwards could cost here; the gap to the
measured forward cost is what the kernels and the framework add."""

from __future__ import annotations

import statistics
import time

import torch

from .forward_cost import _sync
from .roofline import Hardware


def _median_seconds(fn, device, repeats: int) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_hardware(device: str = "cpu", dtype: torch.dtype = torch.float32, repeats: int = 5,
                     n: int | None = None, copy_mib: int | None = None) -> Hardware:
    """Peak FLOP/s of a large square matmul (n × n, default 2048 on CPU, 8192 on GPU) in `dtype` and the
    bandwidth of a large copy (read + write; default 256 MiB on CPU, 2 GiB on GPU)."""
    dev = torch.device(device)
    n = n or (2048 if dev.type == "cpu" else 8192)
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    flops = 2 * n ** 3 / _median_seconds(lambda: a @ b, dev, repeats)
    size = (copy_mib or (256 if dev.type == "cpu" else 2048)) * 2 ** 20
    src = torch.empty(size, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    bandwidth = 2 * size / _median_seconds(lambda: dst.copy_(src), dev, repeats)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "this CPU"
    label = str(dtype).replace("torch.", "")
    return Hardware(f"{name}, measured ({label} matmul, copy)", flops, flops, bandwidth)
