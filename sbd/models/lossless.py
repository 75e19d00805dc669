"""A model's linear layers held in sbd's int4 or int8 formats where that changes no weight.

Why: a GGUF file's Q4_1 and Q8_0 tensors are int4 and int8 values in groups of 32 with float16 numbers per
group (w = q·d + m and w = q·d). Loaded as float32 they take 6-7x the bytes, and a batch-1 forward reads
every weight once: SmolLM2-135M's forward read 538 MB instead of ~95 MB. sbd's CPU products
(`sbd.models.quantized`) compute in those very forms, so such a layer held in them is the same numbers,
and the model the same model: only the order of the sums differs, as it does between any two kernels.

How: each of the base model's linear layers is put in sbd's int4 form, then its int8 form, and held in the
first that gives back every weight bit for bit; a layer that neither gives back stays float. The output
layer may keep up to `TAIL` trailing rows in float32: the mask token sbd adds to a model's vocabulary
(`sbd.add_mask_token`) is the mean of the other rows, which int8 cannot hold. `sbd.load` does this by default
on a CPU (weights=True); weights="float" keeps every layer float.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import SBDError
from .quantized import (GROUP, QuantizedLinear, _base_linears, int4_weights, int8_weights, replace, sbd_groups,
                        sbd_products)

TAIL = 64  # trailing output-layer rows that may stay float32 (tokens added after the file's vocabulary)
PROBE_ROWS = 16  # rows tried first: a layer that is not held exactly is told in microseconds


def pack(model) -> dict[str, str]:
    """Hold `model`'s linear layers in sbd's int4/int8 formats where that is exact (in place; a drafter's
    layers stay float); {layer name: format} of those held so. Nothing off a CPU, or where sbd's products
    cannot run (no compiler, SBD_NATIVE=0)."""
    if model.get_input_embeddings().weight.device.type != "cpu":
        return {}
    head = model.get_output_embeddings()
    linears = _base_linears(model)
    if not linears or not _any_exact(linears) or not sbd_products():
        return {}
    done = {}
    for name, module in linears:
        q = exact(module, tail=TAIL if module is head else 0)
        if q is not None:
            done[name] = replace(module, q)
    if len(done) == len(linears):  # every layer held so: the model's format (`quantized.weights_format`)
        model.config.sbd_weights = "int4" if "int4" in done.values() else "int8"
        model.config.sbd_weights_exact = True  # the file's own numbers (`quantized.held_weights` says so)
    return done


def exact(linear: nn.Linear, tail: int = 0) -> QuantizedLinear | None:
    """`linear` in sbd's int4 form, else its int8 form, where that gives back every weight bit for bit (its
    last `tail` rows at most kept float32 in an int8 layer); else None."""
    w = linear.weight.detach()
    if not _takes(w):
        return None
    for fmt in ("int4", "int8"):
        if not _same_rows(w[:PROBE_ROWS], fmt).all() and not (tail and len(w) <= tail):
            continue
        same, (values, numbers) = _same_rows(w, fmt, keep=True)
        if same.all():
            return QuantizedLinear.on_sbd(fmt, values, numbers, bias=linear.bias)
        first = int((~same).nonzero()[0])
        if fmt == "int8" and len(w) - first <= tail and first > 0:
            return QuantizedLinear.on_sbd(fmt, values[:first], numbers[:first], bias=linear.bias, tail=w[first:])
    return None


def _takes(w: torch.Tensor) -> bool:
    """Whether sbd's forms could hold these weights: float32 (N, K) on a CPU, K in groups of 32."""
    return w.dtype == torch.float32 and w.dim() == 2 and w.shape[1] % GROUP == 0 and w.device.type == "cpu"


def _same_rows(w: torch.Tensor, fmt: str, keep: bool = False):
    """Per row of `w`, whether `fmt` gives it back bit for bit (and, with keep, the values and numbers)."""
    try:
        values, numbers = sbd_groups(w, fmt)
    except SBDError:  # beyond float16's range: not held exactly
        values, numbers = None, None
    if values is None:
        same = torch.zeros(len(w), dtype=torch.bool)
    else:
        back = int4_weights(values, numbers) if fmt == "int4" else int8_weights(values, numbers)
        same = (back.view(torch.int32) == w.contiguous().view(torch.int32)).all(1)
    return (same, (values, numbers)) if keep else same


def _any_exact(linears) -> bool:
    """Whether the first linear layer's first rows are held exactly in either format (before sbd's products
    are built: a float model is told without a compiler run)."""
    w = linears[0][1].weight.detach()
    return _takes(w) and any(bool(_same_rows(w[:PROBE_ROWS], fmt).all()) for fmt in ("int4", "int8"))
