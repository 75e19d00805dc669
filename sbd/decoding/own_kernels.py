"""sbd's own CPU kernels for a decoding forward: attention, the RMS norm and the MLP's SiLU-gated product.

Why: on a CPU at batch 1 a small model's forward spends much of its time around its weight products. torch's
attention takes ~19 µs for one SmolLM2 token over 257 keys and is not row-invariant (the "exact" plan then calls
it once per committed token); its norm is five operations and its activation two. sbd's compiled extension
(sbd/native/attention.h, rows.h) does each in one loop, in a fixed order on every instruction set, each row
alone: a held-int4 SmolLM2 answers 14-18% faster, and sbd-verify's committed rows stay bit for bit NTP's.

Float32 linear layers take sbd's float32 product too (`FloatProduct`: torch's reads SmolLM2's weights more than
once in a forward of a few positions, and is not row-invariant); the engine then takes the "exact" plan for such
a model as for held weights, and sbd-verify's committed rows are bit for bit NTP's (docs/method.md).

Where they run: `LlamaForward` (sbd's engine forward of Llama-family models) asks once, when an engine's
forward is made, so every forward of a call computes alike; its C++ and Python layers then both run them and
agree bit for bit. Their rounding is not torch's: the logits differ from transformers' in their last bits
(`OWN = False` gives transformers' arithmetic; the tests comparing with transformers set it so).
"""

from __future__ import annotations

import torch
from torch import nn

from ..models import extension
from ..models.narrow_linear import NarrowLinear
from .attention import head_size

# False: torch's operations everywhere, transformers' bits at every position
OWN = True


def chosen(model):
    """sbd's compiled extension when its kernels serve `model`'s decoding forwards, else None: float32 on a CPU,
    hidden, MLP and head sizes in steps of 16 (heads up to 128), the extension loaded already (nothing waits for
    a build: until it is, torch's operations run)."""
    emb = model.get_input_embeddings().weight
    config = model.config.get_text_config(decoder=True)
    head = head_size(model)
    sizes = (head, config.hidden_size, config.intermediate_size)
    if not OWN or emb.device.type != "cpu" or emb.dtype != torch.float32 or any(n % 16 for n in sizes) or head > 128:
        return None
    return extension.loaded()


# A float32 product of up to this many positions (batch × width) runs on sbd's; wider ones (a prompt) on torch's.
# On a 2-core Xeon, SmolLM2's linear layers took torch's 0.98-1.03x sbd's time at 1-2 positions (both at the
# memory floor), 1.40-1.45x at 4-8 (sbd's reads the weights once), 1.17x at 16, 0.88x at 32 and 0.79x at 64,
# where torch's blocked product is the faster one; the demo model's 1.04-1.37x up to 16, 1.02x at 32
# (benchmarks/results/float_products/results.md). 32 keeps a batch of 8 four-position forwards row-invariant.
FLOAT_ROWS = 32


def takes_float(own, layers) -> bool:
    """Whether sbd's float32 product serves these layers (torch's float32 linear layers on a CPU, contiguous
    weights, input sizes in steps of 16, no forward of their own swapped in) for an engine whose kernels are
    `own`. (A weight laid out otherwise would be copied on every call: such a layer keeps torch's product.)"""
    return own is not None and all(
        isinstance(lin, nn.Linear) and type(lin).forward in (nn.Linear.forward, NarrowLinear.forward)
        and "forward" not in lin.__dict__ and lin.weight.dtype == torch.float32 and lin.weight.device.type == "cpu"
        and lin.weight.is_contiguous() and lin.in_features % 16 == 0 for lin in layers)


class FloatProduct:
    """sbd's float32 product (`f32_mm`) for float layers that read one input (one layer; q, k and v; gate and
    up), side by side in one call without joining their weights: each output one sum over the input in a fixed
    order, so a row of a many-row forward is bit for bit the row alone, as the quantized products are. Forwards
    wider than `FLOAT_ROWS`, and any with gradients, take torch's product instead (`runs`)."""

    def __init__(self, own, layers):
        self.mm, self.layers = own.f32_mm, tuple(layers)

    def runs(self, rows: int) -> bool:
        return rows <= FLOAT_ROWS and not torch.is_grad_enabled()

    def weights(self) -> list[torch.Tensor]:
        return [lin.weight for lin in self.layers]  # read per call: a weight replaced later is the one used

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        """The layers' outputs side by side for the rows `flat` (M, K), without their biases."""
        return self.mm(flat, self.weights())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One layer's output for x (…, K) with its bias, as its own forward gives it: on sbd's product where
        this forward's positions allow, else the layer's own forward (torch's)."""
        lin = self.layers[0]
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if not self.runs(rows):
            return lin.forward(x)  # (not the module's call: the drafting adapter's hooks are added by the caller)
        y = self.mm(x.reshape(rows, x.shape[-1]), [lin.weight]).view(*x.shape[:-1], -1)
        return y + lin.bias if lin.bias is not None else y


def head_logits(product: FloatProduct | None, head, h: torch.Tensor) -> torch.Tensor:
    """The output layer's logits for h (…, H): on sbd's product where `product` runs this forward, with the
    layer's forward pre-hooks run first as its call would run them (the sampler head captures its input so);
    else the layer's own call (torch's product; any other hook makes it so)."""
    from torch.nn.modules import module as nn_module

    rows = h.numel() // h.shape[-1] if h.shape[-1] else 0
    if (product is None or not product.runs(rows) or head._forward_hooks or head._forward_pre_hooks_with_kwargs
            or nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks):
        return head(h)
    for hook in head._forward_pre_hooks.values():
        got = hook(head, (h,))
        if got is not None:
            h = got[0] if isinstance(got, tuple) else got
    return product.forward(h)
