"""The decoder layers of sbd's Llama forward run from C++: the same operations, the same bits, less time.

Why: a one-token forward of SmolLM2-135M with int4 weights spends about as long around its kernels as in
them: ~2,000 small operations (norms, casts, the rotation, views, cache writes), each ~1.4 µs when Python
calls it and ~0.7 µs from C++, and the Python between them. `sbd/native/decoder_layers.cpp` makes the very
calls `LlamaForward` makes, in the same order (the norm's last four and the rotation's last three as one loop
each, rounded alike), so the logits are bit for bit the Python layers' (tests/test_native_layers.py), except
at a block's rows, where the drafting adapter's update runs on sbd's own loop (`OWN_UPDATE`). Both layers attend
and run their norms and activation on sbd's own kernels where `LlamaForward` chose them (`own_kernels`), else
on torch's operations. The embedding,
the rotary tables, the last norm and the output layer stay in Python (the drafting adapter's and the sampler
head's hooks on them run).

Where it runs: a CPU; linear layers that are torch's own, sbd's narrow ones (`sbd.models.narrow_linear`) or
quantized (`weights="int8"/"int4"`); SiLU activations; the engine's slot cache or the one-length cache of
`sbd forward-cost`, with any attention plan a CPU takes; the drafting adapter's gate in every form a decoding
forward takes. Anything else (other layers, a GPU, gradients) runs the Python layers.

The extension (`sbd.models.extension`) is compiled once per machine. The first process that wants it
compiles it in the background while its forwards run the Python layers, so no call waits for the compiler.
Where it cannot be built, sbd says so once and runs the Python layers: the same tokens of sbd-verify, slower.
`SBD_NATIVE=0` turns it off.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from ..models import extension
from ..models.narrow_linear import NARROWEST, NarrowLinear
from ..models.quantized import QuantizedLinear
from . import own_kernels

KINDS = {"int8": 1, "int4": 2}  # on torch's kernels
SBD_KINDS = {"int8": 4, "int4": 5}  # on sbd's own products (`QuantizedLinear.sbd_kernel`)
MAX_RANK = 256  # the adapter ranks sbd's low_rank_add takes (products.h)
# The drafting adapter's update at a block's rows on sbd's own loop (`low_rank_add`, one call per layer) instead
# of torch's two small products per layer: 0.6-0.8 ms less of an 11-15 ms block forward on SmolLM2. The same sums
# in another order: sbd-verify's tokens never depend on it (the gate is on at masks only); plain SBD's, which
# are drafts, may differ from the Python layers' where two logits nearly tie. False: torch's products, the
# Python layers' bits at every position (the tests compare the two so).
OWN_UPDATE = True


def takes(model) -> bool:
    """Whether the native layers would run a Llama-family `model` (read from the model alone, nothing built):
    layers the extension takes, on a CPU, not switched off nor known to be unbuildable here."""
    return extension.wanted() and not extension.broken() and why_not(model) is None


def why_not(model) -> str | None:
    """None when the native layers can run the decoder layers of `model` (a Llama-family model that
    `LlamaForward` runs), else why not (a phrase)."""
    if model.get_input_embeddings().weight.device.type != "cpu":
        return "the model is not on a CPU"
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        lins = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        if not all(type(lin) in (QuantizedLinear, nn.Linear, NarrowLinear) and "forward" not in lin.__dict__
                   for lin in lins):
            return "its linear layers are not torch's, sbd's narrow or quantized ones"
        if not _silu(m.act_fn):
            return "its activation is not SiLU"
    return None


def _silu(act) -> bool:
    """torch's SiLU or transformers' (`SiLUActivation`: F.silu), with no forward of its own swapped in."""
    kind = type(act)
    ours = kind is nn.SiLU or (kind.__name__ == "SiLUActivation" and kind.__module__ == "transformers.activations")
    return ours and "forward" not in act.__dict__


def _linear(entry, lin) -> tuple:
    """(kind, weight, scales, group, bias, Aᵀ, Bᵀ, narrow lo, narrow hi, A, Bᵀ contiguous) of one layer, as the
    extension takes it: quantized layers by format; float ones by the forward `LlamaForward` bound (`entry`), a
    narrow layer's with the positions it takes its narrow form at; the adapter's factors twice, as torch's
    products take them and as sbd's `low_rank_add` does (float32 only, else None)."""
    _, quantized, _, key, update = entry
    a_t, b_t = update if update is not None else (None, None)
    own = _factors(a_t, b_t)
    if quantized:
        return _kind(lin), lin.qweight, lin.kernel_scales, lin.group, lin.bias, a_t, b_t, 0, 0, *own, 0
    f32_rows = own_kernels.FLOAT_ROWS if getattr(entry[0], "__func__", None) is own_kernels.FloatProduct.forward else 0
    if type(lin) is NarrowLinear:  # (wider than f32_rows, where sbd's float32 product serves it)
        lo = 1 if lin.narrow_single else NARROWEST
        return 3, lin.weight, None, 0, lin.bias, a_t, b_t, lo, lin.narrow_widest, *own, f32_rows
    return 0, lin.weight, None, 0, lin.bias, a_t, b_t, 0, 0, *own, f32_rows


# Bᵀ laid out as rows, per adapter weight (by identity: the weight, its version, the rows): made again only when
# the weight changed in place (training) or is another one
_ROWS: dict[int, tuple] = {}


def _factors(a_t, b_t) -> tuple:
    """(A, Bᵀ) contiguous, float32, for `low_rank_add`; (None, None) for another dtype or no update."""
    if a_t is None or a_t.dtype != torch.float32 or b_t.dtype != torch.float32 or a_t.shape[1] > MAX_RANK:
        return None, None
    a = a_t.t().contiguous()  # the adapter's A itself (r, in), as it is stored
    if b_t.is_contiguous():
        return a, b_t
    base = b_t._base if b_t._base is not None else b_t
    kept = _ROWS.get(id(base))
    if kept is None or kept[0]() is not base or kept[1] != base._version:
        kept = (weakref.ref(base, lambda _, key=id(base): _ROWS.pop(key, None)), base._version, b_t.contiguous())
        _ROWS[id(base)] = kept
    return a, kept[2]


def _kind(q) -> int:
    """The extension's kind of a quantized layer or joint product: its format on torch's kernel or on sbd's."""
    return (SBD_KINDS if q.sbd_kernel else KINDS)[q.fmt]


def _joint(product, sizes) -> tuple | None:
    if product is None:
        return None
    if isinstance(product, own_kernels.FloatProduct):
        return 0, product.layers[0].weight, None, 0, list(sizes), own_kernels.FLOAT_ROWS, product.weights()
    return _kind(product), product.weight, product.scales, product.group, list(sizes), 0, None


class NativeLayers:
    """`LlamaForward`'s decoder layers in the extension's `DecoderLayers`, bound at the first forward that
    finds the extension ready (`ready`: until then, and where it cannot be built, the Python layers run)."""

    def __init__(self, lean):
        self.layers, self.broken = None, False
        self.args = []  # per layer, what `DecoderLayers.add_layer` takes: the Python layers' own tensors
        for layer, entry in zip(lean.inner.layers, lean.layers):
            (n1, e1), (n2, e2), hd, scaling, _, linears, (qkv, gu), qkv_sizes, gu_sizes = entry
            a, m = layer.self_attn, layer.mlp
            mods = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
            self.args.append((n1, e1, n2, e2, hd, scaling, [_linear(e, mod) for e, mod in zip(linears, mods)],
                              _joint(qkv, qkv_sizes), _joint(gu, gu_sizes)))

    def _bound(self):
        """The extension's layers, or None while it is being built or where it cannot be (said once)."""
        if self.layers is None and not self.broken:
            try:
                module = extension.ready()
            except RuntimeError as err:
                self.broken = True
                extension.warn(str(err))
                return None
            if module is None:
                return None
            self.layers = module.DecoderLayers()
            for args in self.args:
                self.layers.add_layer(*args)
        return self.layers

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, layout, gate_mode: int,
                 gate_start: int, gate_per_row: torch.Tensor | None, adapter_scaling: float,
                 own: bool = False, ends: torch.Tensor | None = None) -> torch.Tensor | None:
        """The hidden states after the decoder layers, or None where this forward's cache or plan is not one
        the extension runs (the caller then runs the Python layers). own: the norms and activation on sbd's
        kernels (`own_kernels`); ends: the keys each query sees, for sbd's attention kernel
        (`attention.query_ends`), or None: torch's, as the plan says."""
        layers = self._bound()
        caches = cache.layers
        first = caches[0]
        if layers is None or not getattr(first, "is_initialized", False):
            return None
        plan = layout.plan
        if plan == "rows" and layout.fold != 1 or plan == "split" and layout.mask is None:
            return None
        rows = [int(v) for r in layout.rows for v in r] if plan == "exact" else []
        if hasattr(first, "write_from"):  # the engine's slot cache (`SlotLayer.update`)
            lo, hi, visible, wf, write_at = first.lo, first.hi, first.visible, first.write_from, first.write_at
        elif hasattr(first, "length") and hasattr(first, "capacity"):  # one length for all rows (`SlabLayer.update`)
            lo, hi, wf, write_at = 0, h.shape[0], first.length, None
            visible = wf + h.shape[1]
            if visible > first.capacity:
                raise RuntimeError(f"KV cache overflow: {visible} > capacity {first.capacity}")
        else:
            return None
        out = layers.forward(h, cos, sin, [c._k for c in caches], [c._v for c in caches], lo, hi, visible,
                             -1 if wf is None else wf, None if wf is not None else write_at, plan, layout.length,
                             layout.width, layout.causal_blocks, layout.mask, rows, gate_mode, gate_start,
                             gate_per_row, adapter_scaling, OWN_UPDATE, own, ends)
        if not hasattr(first, "write_from"):
            for c in caches:
                c.length = visible
        return out


def bind(lean) -> NativeLayers | None:
    """`lean`'s layers for the extension where they can run, else None (the Python layers)."""
    if not extension.wanted() or why_not(lean.model) is not None:
        return None
    return NativeLayers(lean)
