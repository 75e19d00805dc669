"""Why sbd computes few-token linear layers as W·xᵀ on CPU: the two forms of the same product, timed.

For each width w (tokens in the forward), the linear layers of a model's shape are applied to w rows,
as torch's `F.linear(x, W)` (x·Wᵀ) and as `sbd.models.narrow_linear.narrow_linear` (W·xᵀ, columns
padded to a multiple of 8 beyond 8; one column padded to two, so that w = 1 is a matrix product, not
torch's matrix-vector one). One weight matrix per layer, as in the model, so that they stream from
memory as a forward's do rather than sitting in cache. Forms and widths are interleaved round by
round; medians; every time relative to F.linear at w = 1 (the cost of a plain decoding step).

    python benchmarks/narrow_linear.py --shape smollm2 --threads 2 --out benchmarks/results/narrow_linear_smollm2.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch

from sbd.models.narrow_linear import narrow_linear

SHAPES = {  # (hidden, intermediate, kv width, layers, vocab)
    "smollm2": (576, 1536, 192, 30, 49153),
    "demo": (256, 1024, 256, 4, 1024),
}


def layer_weights(hidden, inter, kv, layers, vocab):
    w = []
    for _ in range(layers):
        w += [torch.randn(hidden, hidden), torch.randn(kv, hidden), torch.randn(kv, hidden), torch.randn(hidden, hidden),
              torch.randn(inter, hidden), torch.randn(inter, hidden), torch.randn(hidden, inter)]
    return w + [torch.randn(vocab, hidden)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    p.add_argument("--widths", default="1,2,3,4,6,8,9,12,16,17,24,32,48,64")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--onednn", action="store_true",
                   help="add a third form: oneDNN's inner product (torch's mkldnn_linear) on pre-converted weights")
    p.add_argument("--out", default=None, help="markdown file for the table")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    weights = layer_weights(*SHAPES[args.shape])
    widths = [int(w) for w in args.widths.split(",")]
    inputs = {w: {n: torch.randn(w, n) for n in {m.shape[1] for m in weights}} for w in widths}
    forms = {"F.linear": lambda x, m: torch.nn.functional.linear(x, m), "narrow": lambda x, m: narrow_linear(x, m, None)}
    if args.onednn:  # oneDNN's inner product on a copy of each weight in its own layout (x converted per call)
        packed = {id(m): m.to_mkldnn() for m in weights}
        forms["oneDNN"] = lambda x, m: torch._C._nn.mkldnn_linear(x.to_mkldnn(), packed[id(m)], None).to_dense()
    times = {(f, w): [] for f in forms for w in widths}
    with torch.inference_mode():
        for r in range(args.repeats + 1):  # round 0 warms up
            for w in widths:
                for f, fn in forms.items():
                    xs = inputs[w]
                    t = time.perf_counter()
                    for m in weights:
                        fn(xs[m.shape[1]], m)
                    if r:
                        times[(f, w)].append(time.perf_counter() - t)
    one = statistics.median(times[("F.linear", 1)])
    title = f"# Linear layers of the {args.shape} shape: time relative to F.linear at w = 1 ({one * 1e3:.1f} ms)"
    setup = f"{args.threads} threads, float32, medians of {args.repeats}."
    write_table(title, setup, list(forms), widths, times, one, args.out)
    return 0


def write_table(title, setup, forms, widths, times, one, out=None) -> str:
    """Print (and write to `out`) the markdown table of median times per form and width, relative to `one`,
    under a title and the exact command. Shared with forward_forms.py."""
    lines = [title, "", f"`python {' '.join(sys.argv)}` — {platform.processor() or platform.machine()}, torch "
             f"{torch.__version__}, {setup}", "",
             "| form | " + " | ".join(f"w={w}" for w in widths) + " |", "|---|" + "---:|" * len(widths)]
    for f in forms:
        lines.append(f"| {f} | " + " | ".join(f"{statistics.median(times[(f, w)]) / one:.2f}" for w in widths) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as fh:
            fh.write(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
