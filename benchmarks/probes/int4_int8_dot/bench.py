"""Would an int4 kernel with integer dot products make wide forwards cheap? A probe, not shipped.

torch's int4 CPU kernel (`_weight_int4pack_mm_for_cpu`, what `weights="int4"` runs) widens the weights to
float and multiplies in float: on 2 cores each extra row of a forward costs ~1.6 ms over SmolLM2's 30 layers,
so an 8-token verifying forward costs ~2.1x a one-token one. llama.cpp instead rounds the activations to
int8 per block of 32 and takes integer dot products (exact sums). This probe builds such a kernel
(torch.utils.cpp_extension, ~25 s) and times it against torch's on SmolLM2's four products per layer
(q|k|v 576→960, o 576→576, gate|up 576→3072, down 1536→576), 1 to 16 rows, weights warm in the cache,
the two kernels in turns. It also checks that a row's output does not depend on the other rows (what keeps
sbd-verify exact) and the error against the float product of the same int4 weights.

    python benchmarks/probes/int4_int8_dot/bench.py --columns 16   # AVX-512 VNNI
    python benchmarks/probes/int4_int8_dot/bench.py --columns 8    # VNNI on 256 bits, else AVX2
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (in, out) of one SmolLM2 layer's products


def pack(w: torch.Tensor, columns: int):
    """Round w (N, K) to int4 groups of 32 along K (w ≈ d·q + m) and lay them out for the kernel: per group of
    `columns` outputs and block of 32 inputs, 8 registers of (columns × 4 inputs) nibbles, two to a byte.
    Returns (packed, d, m in the kernel's layout, the dequantized weights, q, d, m per row)."""
    N, K = w.shape
    B = K // 32
    g = w.view(N, B, 32)
    lo, hi = g.amin(-1), g.amax(-1)
    d = (hi - lo) / 15
    q = ((g - lo[..., None]) / d.clamp_min(1e-12)[..., None]).round().clamp(0, 15).to(torch.uint8)
    regs = q.view(N // columns, columns, B, 8, 4).permute(0, 2, 3, 1, 4).reshape(N // columns, B, 8, 4 * columns)
    packed = (regs[:, :, 0::2] | (regs[:, :, 1::2] << 4)).contiguous()
    d, lo = d.half().float(), lo.half().float()  # float16 scale and minimum, as GGUF's Q4_1 keeps them
    deq = (q.float() * d[..., None] + lo[..., None]).view(N, K)
    layout = lambda t: t.view(N // columns, columns, B).permute(0, 2, 1).contiguous().half()  # noqa: E731
    return packed, layout(d), layout(lo), deq, q.view(N, K), d, lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--columns", type=int, choices=(8, 16), default=16)
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--layers", type=int, default=1,
                    help="distinct layers' weights (30: a whole SmolLM2, 60 MB, as decoding reads them; 1: one layer, warm)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    started = time.time()
    ext = load(f"sbd_probe_int4_int8_x{args.columns}", [str(Path(__file__).with_name("kernel.cpp"))],
               extra_cflags=["-O3", "-march=native", f"-DCOLUMNS={args.columns}"])
    print(f"build: {time.time() - started:.1f} s")
    gen = torch.Generator().manual_seed(0)
    layers = []
    for K, N in SHAPES * args.layers:
        w = torch.randn(N, K, generator=gen) * 0.05
        packed, d, m, deq, q, d_rows, m_rows = pack(w, args.columns)
        # torch's int4 layout: w = (q - 8)·scale + zero, scales_and_zeros (K/32, N, 2) in bfloat16
        tw = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        sz = torch.stack([d_rows.t(), (m_rows + 8 * d_rows).t()], -1).contiguous().to(torch.bfloat16)
        layers.append((K, packed, d, m, deq, tw, sz))
    rows = [int(r) for r in args.rows.split(",")]
    xs = {(M, K): torch.randn(M, K, generator=gen) for M in rows + [8] for K, *_ in layers[:len(SHAPES)]}
    K, packed, d, m, deq, tw, sz = layers[0]
    x = xs[(8, K)]
    ref = x @ deq.t()
    ours = ext.q4q8_mm(x, packed, d, m)
    theirs = torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), tw, 32, sz).float()
    print(f"largest error against the float product of the same int4 weights, over its largest value: ours "
          f"{((ours - ref).abs().max() / ref.abs().max()).item():.4f}, torch's {((theirs - ref).abs().max() / ref.abs().max()).item():.4f}")
    alone = all(torch.equal(ours[i:i + 1], ext.q4q8_mm(x[i:i + 1], packed, d, m)) for i in range(8))
    print(f"each row the same alone as among 8: {alone}")

    def run(kind: str, M: int) -> None:
        for K, packed, d, m, deq, tw, sz in layers:
            if kind == "ours":
                ext.q4q8_mm(xs[(M, K)], packed, d, m)
            else:
                torch.ops.aten._weight_int4pack_mm_for_cpu(xs[(M, K)].bfloat16(), tw, 32, sz)

    print("| rows | integer dots: ms for 30 layers | torch's int4: ms | torch / ours |\n|---:|---:|---:|---:|")
    for M in rows:
        times = {"ours": [], "torch": []}
        for _ in range(args.repeats):
            for kind in times:  # in turns
                t = time.perf_counter()
                for _ in range(30 // args.layers):
                    run(kind, M)
                times[kind].append((time.perf_counter() - t) * 1e3)
        a, b = statistics.median(times["ours"]), statistics.median(times["torch"])
        print(f"| {M} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
