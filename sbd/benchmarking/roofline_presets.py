"""Hardware and model constants for the roofline model. Peaks are the vendors' dense (no sparsity)
figures for SXM boards; real kernels reach a fraction of them."""

from __future__ import annotations

from .roofline import Hardware, ModelShape

TERA = 1e12

HARDWARE = {
    "h100-bf16": Hardware("H100 SXM, bf16", 989.4 * TERA, 989.4 * TERA, 3.35 * TERA),
    "h100-fp8": Hardware("H100 SXM, fp8 linear layers, bf16 attention", 1978.9 * TERA, 989.4 * TERA, 3.35 * TERA),
    "h200-bf16": Hardware("H200 SXM, bf16", 989.4 * TERA, 989.4 * TERA, 4.8 * TERA),
    "h200-fp8": Hardware("H200 SXM, fp8 linear layers, bf16 attention", 1978.9 * TERA, 989.4 * TERA, 4.8 * TERA),
}

LLAMA_31_8B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)

MODELS = {
    "llama-3.1-8b-bf16": ModelShape("Llama-3.1-8B, bf16", **LLAMA_31_8B, weight_bytes=2, kv_bytes=2, act_bytes=2),
    # the paper's setting: FP8 weights and KV cache, 1-byte activations as its code assumes
    "llama-3.1-8b-fp8": ModelShape("Llama-3.1-8B, fp8", **LLAMA_31_8B, weight_bytes=1, kv_bytes=1, act_bytes=1),
}
