"""sbd's own CPU kernels for a decoding forward: attention, the RMS norm and the MLP's SiLU-gated product.

Why: on a CPU at batch 1 a small model's forward spends much of its time around its weight products. torch's
attention takes ~19 µs for one SmolLM2 token over 257 keys and is not row-invariant (the "exact" plan then calls
it once per committed token); its norm is five operations and its activation two. sbd's compiled extension
(sbd/native/attention.h, rows.h) does each in one loop, in a fixed order on every instruction set, each row
alone: a held-int4 SmolLM2 answers 14-18% faster, and sbd-verify's committed rows stay bit for bit NTP's.

Where they run: `LlamaForward` (sbd's engine forward of Llama-family models) asks once, when an engine's
forward is made, so every forward of a call computes alike; its C++ and Python layers then both run them and
agree bit for bit. Their rounding is not torch's: the logits differ from transformers' in their last bits
(`OWN = False` gives transformers' arithmetic; the tests comparing with transformers set it so).
"""

from __future__ import annotations

import torch

from ..models import extension
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
