"""Narrow forwards on CPU: the linear layers of a few-token forward computed as W·xᵀ instead of x·Wᵀ.

Why: SBD's forwards are narrow (a verify step with a draft of d tokens is 2d + 2 tokens wide). On a CPU
a 1-token forward is a matrix-vector product that streams the weights once; x·Wᵀ for a handful of rows
(what `torch.nn.functional.linear` computes) takes MKL's general path and costs 1.7–2.3x as much on
SmolLM2's shapes, so a draft has to be accepted often just to break even. The same product with the
weight as the left operand, W·xᵀ, costs 0.9–1.1x the 1-token product up to 4 columns and 1.4–1.8x
at 6–16 (the 2-core AVX2 machine of docs/performance.md; `benchmarks/narrow_linear.py`).
Beyond 4 columns it pays only when the weights stream from memory: on a model whose linear layers fit
in the cache (the 4.7M demo model: 18 MB) x·Wᵀ is the faster form there. So a forward of 2..4 positions
(rows × width) always runs as W·xᵀ, and one of up to 64 positions too when the linear layers
outweigh the cache (`CACHED_BYTES`), with its columns padded to a multiple of 8.

All of this holds for torch's MKL on AMD CPUs; on an Intel Xeon MKL's matrix-vector and few-row products
were the faster ones (W·xᵀ took 2.4x as long at one and two rows), so `sbd.load` switches the narrow path
on for AMD CPUs only (`worth_it`).

One-token forwards (plain greedy decoding, and the steps of sbd-verify that carry no draft) take the
same path when the weights stream from memory, as a product with two columns, the second one zero:
torch's matrix-vector product (MKL's gemv on this class of machine) runs on one thread and streams
the weights at about 12 GB/s, slower than its matrix product even on one thread; two columns take
the matrix product, on every thread. Measured on SmolLM2-135M (2-core AMD EPYC, torch 2.13 with MKL
2024.2): a one-token forward 55 → 31 ms; its 49152 × 576 output layer alone 9.5 → 3.0 ms
(docs/performance.md, "Narrow forwards"); on a Zen 4 with AVX-512, 57 → 36 ms
(benchmarks/results/forward_forms_smollm2.md). With the weights in the cache (the demo model) the
matrix-vector product is the faster one and stays. Long forwards (prefill) and anything that needs
gradients are left to `torch.nn.functional.linear`.

Where sbd's own kernels serve a model's decoding forwards (`sbd.decoding.own_kernels`), its float32 layers take
sbd's float32 product instead in forwards of up to 32 positions, on every CPU; the narrow path serves the rest.

The result equals `F.linear` up to float rounding (another summation order), the same kind of
difference as between a 1-token and a wide forward through `F.linear` itself.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

NARROWEST, WIDEST = 2, 64  # positions per forward (rows × width) the narrow path may take
ALWAYS = 4  # up to this many it pays on every model measured; beyond, only on weights that leave the cache
CACHED_BYTES = 64 * 2**20  # linear weights above this stream from memory (above any L3 cache of this class)
PAD = 8  # MKL's narrow kernels are cheapest at multiples of 8 columns


def narrow_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` computed as weight · xᵀ, for few positions."""
    flat = x.reshape(-1, x.shape[-1])
    m = flat.shape[0]
    cols = -(-m // PAD) * PAD if m > PAD else max(m, 2)  # one column would be the matrix-vector product
    if cols != m:
        flat = torch.cat([flat, flat.new_zeros(cols - m, flat.shape[1])])
    if bias is None:
        out = weight @ flat.t()
    else:
        out = torch.addmm(bias[:, None], weight, flat.t())
    # the product is column-major; later kernels (attention above all) want rows contiguous
    return out.t()[:m].contiguous().reshape(*x.shape[:-1], weight.shape[0])


class NarrowLinear(nn.Linear):
    """An `nn.Linear` (same parameters, state dict and hooks) that takes the narrow path when it pays."""

    narrow_widest = WIDEST  # set per model by `use_narrow_linear`
    narrow_single = False  # one-token products as two columns (weights that stream from memory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        lo = 1 if self.narrow_single else NARROWEST
        if lo <= m <= self.narrow_widest and x.device.type == "cpu" and not torch.is_grad_enabled():
            return narrow_linear(x, self.weight, self.bias)
        return super().forward(x)


def use_narrow_linear(model: nn.Module, on: bool = True, widest: int | None = None,
                      single: bool | None = None) -> int:
    """Switch every plain `nn.Linear` of `model` to the narrow path (`on=False`: back). In place; the
    modules keep their parameters and hooks. widest: the most positions a forward may have to take the
    narrow path (default: `WIDEST` when the linear weights outweigh the cache, else `ALWAYS`); single:
    one-token forwards too, as two-column products (default: when the weights outweigh the cache).
    Returns how many layers were switched."""
    source, target = (nn.Linear, NarrowLinear) if on else (NarrowLinear, nn.Linear)
    layers = [m for m in model.modules() if type(m) is source]
    if on:
        size = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear))
        streams = size > CACHED_BYTES
        widest = (WIDEST if streams else ALWAYS) if widest is None else widest
        single = streams if single is None else bool(single)
    for module in layers:
        module.__class__ = target
        if on:
            module.narrow_widest, module.narrow_single = widest, single
        else:
            module.__dict__.pop("narrow_widest", None)
            module.__dict__.pop("narrow_single", None)
    return len(layers)


def uses_narrow_linear(model: nn.Module) -> bool:
    return any(type(m) is NarrowLinear for m in model.modules())


def worth_it(device, dtype) -> bool:
    """On by default for float32 models on an AMD CPU with torch's MKL, where it was measured to pay (EPYC,
    Zen 4: MKL's matrix-vector product runs on one thread there, and its few-row products take a general
    path); elsewhere the default kernels. On an Intel Xeon MKL's own products were the faster ones: SmolLM2's
    linear layers took 2.4x as long at one token on the narrow path, and float32 decoding ran at half speed
    (docs/performance.md §9, "Float32 linear layers")."""
    return (torch.device(device).type == "cpu" and dtype == torch.float32 and cpu_vendor() == "AuthenticAMD"
            and torch.backends.mkl.is_available())


def cpu_vendor() -> str | None:
    """The CPU's vendor as the processor names itself ("AuthenticAMD", "GenuineIntel"), or None where
    /proc/cpuinfo does not say (not Linux, not x86)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@contextlib.contextmanager
def linear_layers(model: nn.Module, narrow: bool | None):
    """Within the block, `model`'s linear layers take the narrow path (True) or are torch's own (False:
    stock transformers, e.g. for a Hugging Face baseline); None leaves them as they are. Restored after."""
    if narrow is None:
        yield
        return
    before = uses_narrow_linear(model)
    use_narrow_linear(model, narrow)
    try:
        yield
    finally:
        use_narrow_linear(model, before)
