"""Make the tiny test model for the vLLM plug-in checks.

    python tests/vllm/make_tiny.py /tmp/tiny_llama [--arch llama]    (either venv: sbd's or vLLM's)

Writes a random model (`sbd init`'s defaults) and, in its sub-folder `sbd_adapter/`, a drafting adapter with random
(non-zero) updates and mask embedding, so that a gate leaking onto a committed row would change the
model's tokens: exactness checks then mean something.
"""

import argparse
from pathlib import Path

import torch


def make(out, arch: str = "llama", block_size: int = 4, seed: int = 0, head: str | None = None,
         shape: str | None = None, context: int = 1024) -> Path:
    """Write the tiny model and its random adapter to `out` (the model only if it is not there yet); head
    "plain" or "state": a sampler head with random non-zero weights beside the adapter (with its state).
    shape: a real model's sizes instead (`sbd.benchmarking.presets.SHAPES`, e.g. smollm2-135m: the GPU
    script times vLLM on it), vocabulary included, over the same small tokenizer. context: the longest
    sequence the model takes (a stream that must outlast a signal needs room to run)."""
    from transformers import AutoModelForCausalLM

    from sbd.drafters import adapter
    from sbd.models import tiny

    out = Path(out)
    if not (out / "config.json").is_file():
        if shape is None:  # the sizes of `sbd init`'s defaults
            tiny.create(out, arch=arch, seed=seed, hidden=128, layers=4, heads=4, kv_heads=2, context=context)
        else:
            from sbd.benchmarking.presets import SHAPES

            s = SHAPES[shape]
            model, _ = tiny.create(out, arch=arch, seed=seed, hidden=s["hidden_size"], layers=s["num_hidden_layers"],
                                   heads=s["num_attention_heads"], kv_heads=s["num_key_value_heads"],
                                   intermediate=s["intermediate_size"], context=4096)
            model.resize_token_embeddings(max(s["vocab_size"], model.config.vocab_size), mean_resizing=False)  # the real lm_head's cost
            model.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ad = adapter.attach(model, adapter.AdapterConfig(r=4, lora_alpha=8.0, block_size=block_size))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in ad.lora_B.values():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        ad.mask_embedding.copy_(torch.randn(ad.mask_embedding.shape, generator=g) * 0.05)
    adapter.save(model, out / "sbd_adapter")
    if head is not None:
        from sbd.drafters import sampler_head

        h = sampler_head.attach(model, sampler_head.SamplerHeadConfig(width=16, top_k=4, state=head == "state"))
        scale = model.get_input_embeddings().weight.std()
        with torch.no_grad():
            for p in h.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 3.0 / p.shape[-1] ** 0.5)
            h.up.weight[:, model.config.hidden_size:] /= scale  # the previous token weighs as much as the state
        sampler_head.save(model, out / "sbd_adapter")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--head", choices=["plain", "state"], default=None, help="also a random sampler head")
    ap.add_argument("--shape", default=None, help="a real model's sizes (sbd.benchmarking.presets), e.g. smollm2-135m")
    args = ap.parse_args()
    out = make(args.out, args.arch, args.block_size, args.seed, args.head, args.shape)
    print(f"wrote {out} and {out / 'sbd_adapter'}")


if __name__ == "__main__":
    main()
