"""What the linear-layer form does to a whole forward: SmolLM2-135M (the shipped model, no adapter gate)
over a cached prompt, at several widths, with sbd's narrow layers (`sbd.models.narrow_linear`), with
torch's own `F.linear` (stock transformers), with oneDNN's inner product for forwards of at least
--onednn-from positions (narrow below), and with MKL's packed product (weights packed once per padded
width, `torch.ops.mkl._mkl_linear`) from --packed-from positions (narrow below). Forms and widths
interleaved round by round, medians; every time relative to the narrow 1-token forward (sbd's NTP step).

    python benchmarks/forward_forms.py --threads 2 --out benchmarks/results/forward_forms_smollm2.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from narrow_linear import write_table  # this folder's sibling script


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--widths", default="1,2,4,8,9,12,16,17,24,32")
    p.add_argument("--context", type=int, default=300, help="cached tokens before each timed forward")
    p.add_argument("--onednn-from", type=int, default=9, help="oneDNN takes forwards at least this wide")
    p.add_argument("--packed-from", type=int, default=3, help="MKL's packed product takes forwards at least this wide")
    p.add_argument("--forms", default="narrow,F.linear,oneDNN,MKL packed", help="which forms to time")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="markdown file for the table")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import DynamicCache

    import sbd
    from sbd.models import narrow_linear as nl
    from sbd.models.cache_arg import with_cache

    model, _ = sbd.load(args.model, sampler_head=False, weights="float")
    model.eval()
    packed = {id(m): m.weight.to_mkldnn() for m in model.modules()
              if isinstance(m, torch.nn.Linear) and m.weight.numel() > 1 << 16}
    narrow_forward = nl.NarrowLinear.forward
    forms = tuple(args.forms.split(","))
    widths = [int(w) for w in args.widths.split(",")]
    pad = sorted({max(4, -(-w // 8) * 8) if w > 4 else 4 for w in widths if w >= args.packed_from})
    mkl_packs = {}
    if "MKL packed" in forms:  # one packed copy of every large weight per padded width: memory, not speed
        mkl_packs = {(id(m), c): torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), c)
                     for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.numel() > 1 << 16
                     for c in pad}

    def packed_forward(self, x):
        m = x.numel() // x.shape[-1]
        c = next((c for c in pad if c >= m), None)
        if m >= args.packed_from and c is not None and (id(self), c) in mkl_packs and not torch.is_grad_enabled():
            flat = x.reshape(m, -1)
            if c != m:
                flat = torch.cat([flat, flat.new_zeros(c - m, flat.shape[1])])
            y = torch.ops.mkl._mkl_linear(flat, mkl_packs[(id(self), c)], self.weight, self.bias, c)[:m]
            return y.reshape(*x.shape[:-1], -1)
        return narrow_forward(self, x)

    def onednn_forward(self, x):
        m = x.numel() // x.shape[-1]
        if m >= args.onednn_from and id(self) in packed and not torch.is_grad_enabled():
            y = torch._C._nn.mkldnn_linear(x.reshape(m, -1).to_mkldnn(), packed[id(self)], None).to_dense()
            y = y if self.bias is None else y + self.bias
            return y.reshape(*x.shape[:-1], -1)
        return narrow_forward(self, x)

    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    inputs = {w: torch.randint(0, vocab, (1, w), generator=g) for w in widths}
    cache = DynamicCache(config=model.config)
    times = {(f, w): [] for f in forms for w in widths}
    try:
        with torch.inference_mode():
            model(input_ids=torch.randint(0, vocab, (1, args.context), generator=g), **with_cache(model, cache),
                  use_cache=True, logits_to_keep=1)
            for r in range(args.repeats + 1):  # round 0 warms up
                for w in widths:
                    for f in forms:
                        nl.use_narrow_linear(model, f != "F.linear")
                        nl.NarrowLinear.forward = {"oneDNN": onednn_forward, "MKL packed": packed_forward}.get(f, narrow_forward)
                        pos = torch.arange(args.context, args.context + w)[None]
                        t = time.perf_counter()
                        model(input_ids=inputs[w], position_ids=pos, **with_cache(model, cache), use_cache=True,
                              logits_to_keep=w)
                        dt = time.perf_counter() - t
                        cache.crop(-w)
                        if r:
                            times[(f, w)].append(dt)
    finally:
        nl.NarrowLinear.forward = narrow_forward
    one = statistics.median(times[("narrow", 1)])
    title = (f"# Whole {args.model} forwards by linear-layer form: time relative to the narrow 1-token forward "
             f"({one * 1e3:.1f} ms)")
    setup = (f"{args.threads} threads, float32, {args.context} cached tokens, medians of {args.repeats}. oneDNN from "
             f"{args.onednn_from} positions, MKL packed from {args.packed_from} (narrow below).")
    write_table(title, setup, forms, widths, times, one, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
