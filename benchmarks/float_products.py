"""sbd's float32 product (`f32_mm`) against torch's (`F.linear`, MKL on this class of machine) over a model's
own linear layers, in the order a forward runs them (every decoder layer's seven, then the output layer), at
M positions per forward: the products of a forward of M tokens, without the rest of it. The two in turns, each
round all layers once per setting; medians of the rounds after the first. The largest difference to torch's
output says the two compute the same thing to rounding.

Why: it sets `own_kernels.FLOAT_ROWS`, the widest forward that takes sbd's product, and shows where a float32
forward's products stand against the weights' memory floor (one read of every weight).

    python benchmarks/float_products.py --model smollm2 --rows 1,2,4,8,16,32,64
    python benchmarks/float_products.py --model sbd/demo_model/sbd --rows 1,2,4,8,16,32,64 --rounds 41
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="a model sbd.load takes (smollm2: its float32 weights)")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64", help="positions per forward, comma-separated")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of every layer per setting (the first untimed)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import sbd
    from sbd.models import extension

    ext = extension.build()
    torch.set_num_threads(args.threads)  # (after the build: importing sbd sets torch's threads)
    kw = {"weights": "float"} if args.model == "smollm2" else {"dtype": torch.float32}
    model, _ = sbd.load(args.model, **kw)
    weights = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        weights += [lin.weight for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)]
    weights.append(model.get_output_embeddings().weight)
    weights = [w.detach().float().contiguous() for w in weights]
    size = sum(w.numel() * 4 for w in weights)
    settings = {"torch": lambda x, w: torch.nn.functional.linear(x, w), "sbd": lambda x, w: ext.f32_mm(x, [w])}
    gen = torch.Generator().manual_seed(0)
    print(f"{args.model}, {len(weights)} float32 linear layers, {size / 1e6:.1f} MB; {platform.processor() or platform.machine()}, "
          f"{args.threads} threads, torch {torch.__version__}; medians of {args.rounds - 1} rounds, the two in turns\n")
    print("| positions | torch's ms | sbd's ms | torch / sbd time | largest difference |")
    print("|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            xs = {k: torch.randn(rows, k, generator=gen) for k in {w.shape[1] for w in weights}}
            times = {name: [] for name in settings}
            for _ in range(args.rounds):
                for name, fn in settings.items():
                    start = time.perf_counter()
                    for w in weights:
                        fn(xs[w.shape[1]], w)
                    times[name].append(time.perf_counter() - start)
            t, s = (statistics.median(times[name][1:]) for name in settings)
            diff = max((settings["sbd"](xs[w.shape[1]], w) - settings["torch"](xs[w.shape[1]], w)).abs().max().item()
                       for w in weights[:7])
            print(f"| {rows} | {1e3 * t:.2f} | {1e3 * s:.2f} | {t / s:.2f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
