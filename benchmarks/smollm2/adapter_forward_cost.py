"""What the drafting adapter adds to a decoding forward: SmolLM2-135M-Instruct with its
shipped adapter, the forwards sbd-verify makes (w tokens over a cached prompt, the last w − c of them the
gated block), timed with the adapter's gate off and on, interleaved round by round, medians.

    python benchmarks/smollm2/adapter_forward_cost.py --out benchmarks/smollm2/results/adapter_forward_cost.md

The gate off is the frozen model's forward of the same shape (what the eq.-16 limit timed before
session 5); on is what decoding runs. The difference is the adapter's cost per forward: its low-rank
products on every targeted layer (210 on SmolLM2), which are small, but each one a few kernel calls.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--cached", type=int, default=300, help="tokens already in the cache (a chat prompt)")
    ap.add_argument("--shapes", default="2:1,4:2,8:4,12:4,16:8,17:9",
                    help="width:committed pairs; the rest of each forward is the gated block")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import sbd
    from sbd.drafters.adapter import adapter_of, gated
    from sbd.benchmarking.forward_cost import _prefilled
    from sbd.decoding.cache import crop
    from sbd.masks import inference_mask
    from sbd.models.cache_arg import with_cache

    model, _ = sbd.load(args.model, weights="float")
    adapter = adapter_of(model)
    if adapter is None:
        raise SystemExit(f"{args.model} has no drafting adapter")
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
    gen = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    times: dict[tuple, list[float]] = {}
    one: list[float] = []
    with torch.inference_mode():
        cache, pad = _prefilled(model, 1, args.cached, max(w for w, _ in shapes), "cpu", gen)
        calls = []
        for w, c in [(1, 1)] + shapes:
            ids = torch.randint(3, vocab, (1, w), generator=gen)
            pos = (args.cached + torch.arange(w))[None]
            kw = dict(input_ids=ids, position_ids=pos, attention_mask=inference_mask(pad, args.cached, c, w - c),
                      **with_cache(model, cache), use_cache=True, logits_to_keep=w)
            calls += [((w, c, None), kw)] if w == 1 else [((w, c, None), kw), ((w, c, c), kw)]
        for round_ in range(args.repeats + 2):
            for key, kw in calls:
                with gated(model, key[2]):
                    t = time.perf_counter()
                    model(**kw)
                    t = time.perf_counter() - t
                crop(cache, key[0])
                if round_ >= 2:
                    (one if key[0] == 1 else times.setdefault(key, [])).append(t)
    t1 = statistics.median(one)
    lines = [f"Adapter cost per decoding forward: {args.model}, {len(adapter.names)} adapted layers, "
             f"{args.cached} cached tokens, batch 1, {platform.machine()} {args.threads} threads, "
             f"torch {torch.__version__}; medians of {args.repeats} interleaved rounds. "
             f"A 1-token forward: {1e3 * t1:.1f} ms.", "",
             "| width (committed + gated) | gate off, ms | gate on, ms | adapter cost | on / 1-token |",
             "|---|---:|---:|---:|---:|"]
    for w, c in shapes:
        off, on = statistics.median(times[(w, c, None)]), statistics.median(times[(w, c, c)])
        lines.append(f"| {w} ({c} + {w - c}) | {1e3 * off:.1f} | {1e3 * on:.1f} | "
                     f"{1e3 * (on - off):+.1f} ms ({100 * (on / off - 1):+.0f}%) | {on / t1:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        cmd = (f"python benchmarks/smollm2/adapter_forward_cost.py --model {args.model} --cached {args.cached} "
               f"--shapes {args.shapes} --repeats {args.repeats} --threads {args.threads} --out {args.out}")
        Path(args.out).write_text(text + f"\n\nCommand: `{cmd}`\n")


if __name__ == "__main__":
    main()
