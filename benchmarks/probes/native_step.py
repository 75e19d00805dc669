"""One decoding forward of SmolLM2 + its drafter through the decoder layers from C++ against the same forward
through the Python layers (both sbd's own forward, `sbd.decoding.llama_forward`, both on sbd's own attention,
norm and activation: `sbd.decoding.own_kernels`) and against eager PyTorch (the Python layers on torch's
attention, norm and activation; the same weights and products), in turns: NTP steps (w = 1)
and verifying forwards of w positions, the first committed and the rest a block of masks, over 256 cached
tokens; medians of --repeats rounds after 3 untimed ones. The C++ layers are sbd's low-overhead static step on a
CPU: this is what they gain over eager PyTorch, forward for forward (the generation loop, sampling and the
prompt's forward excluded; native_layers.py times whole answers). A third setting runs the C++ layers with the
drafting adapter's update on torch's two products per layer (`native_layers.OWN_UPDATE = False`).

    python benchmarks/probes/native_step.py --weights defaults     # or float32; --plan uniform
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", choices=("defaults", "float32"), default="defaults")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--cached", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--plan", choices=("engine", "uniform"), default="engine",
                    help="engine: the attention plan decoding takes (the exact plan on row-invariant weights: one "
                         "committed token, then the block); uniform: `sbd forward-cost`'s (open or split)")
    args = ap.parse_args()

    import sbd
    from sbd.benchmarking.forward_cost import Shape, _attending, _prefilled
    from sbd.decoding.attention import exact_plan, routed
    from sbd.decoding.cache import crop
    from sbd.decoding import own_kernels
    from sbd.decoding.llama_forward import LlamaForward
    from sbd.drafters.adapter import gated
    from sbd.models import extension
    from sbd.models.quantized import held_weights, row_invariant

    extension.build()
    torch.set_num_threads(2)
    model, _ = sbd.load("smollm2", weights=True if args.weights == "defaults" else "float")
    native = LlamaForward(model)
    extension_wanted = extension.wanted
    extension.wanted = lambda: False
    python = LlamaForward(model)
    own_kernels.OWN = False
    eager = LlamaForward(model)
    own_kernels.OWN = True
    extension.wanted = extension_wanted
    assert native.native is not None and python.native is None and eager.native is None
    assert native.own is not None and python.own is not None and eager.own is None
    widths = [int(w) for w in args.widths.split(",")]
    gen = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    from sbd.decoding import native_layers

    settings = (("python", python, True), ("native", native, True), ("native, torch's update", native, False),
                ("eager", eager, True))
    times = {(w, k): [] for w in widths for k, _, _ in settings}
    with torch.inference_mode():
        cache, pad = _prefilled(model, 1, args.cached, max(widths), torch.device("cpu"), gen)
        calls = []
        for w in widths:
            s = Shape(1, w, args.cached, n_commit=1)
            ids = torch.randint(3, vocab, (1, w), generator=gen)
            pos = (args.cached + torch.arange(w))[None]
            kw = _attending(model, s, dict(input_ids=ids, position_ids=pos), pad, args.cached)
            if args.plan == "engine" and (row_invariant(model) or native.float_invariant):
                kw["sbd_layout"] = exact_plan([(args.cached, w, 1, False)], w, False)
            calls.append((w, s, kw))
        for round_ in range(3 + args.repeats):
            for w, s, kw in calls:
                for name, lean, own in settings:
                    native_layers.OWN_UPDATE = own
                    start = time.perf_counter()
                    with gated(model, s.commit if s.commit < w else None), routed(model, True):
                        lean(kw["input_ids"], kw["position_ids"], cache, kw["sbd_layout"], w)
                    if round_ >= 3:
                        times[w, name].append(time.perf_counter() - start)
                    crop(cache, w)
    print(f"SmolLM2-135M + drafter, {held_weights(model)} weights, {args.cached} cached, batch 1, 2 threads, "
          f"torch {torch.__version__}; {calls[-1][2]['sbd_layout'].plan} plan at w > 1; medians of {args.repeats} "
          "rounds, the settings in turns")
    print("| w | eager PyTorch ms | Python layers ms | C++ layers ms | C++ / eager speed | C++ / Python speed | "
          "C++ layers, the adapter's update on torch's products ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for w in widths:
        p, n, t, e = (statistics.median(times[w, k]) for k, _, _ in settings)
        print(f"| {w} | {1e3 * e:.2f} | {1e3 * p:.2f} | {1e3 * n:.2f} | {e / n:.2f}x | {p / n:.2f}x | {1e3 * t:.2f} |")


if __name__ == "__main__":
    main()
