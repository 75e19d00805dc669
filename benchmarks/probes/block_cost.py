"""What a block of masks adds to a forward of SmolLM2 + its drafter on its defaults (the held int4 weights, the C++
layers): forwards of w positions, all committed or the first committed and the rest masks (the drafting adapter's
gate on there), over 256 cached tokens, in turns; medians of 30 rounds after 3.

    python benchmarks/probes/block_cost.py
"""

from __future__ import annotations

import statistics
import time

import torch


def main() -> None:
    import sbd
    from sbd.benchmarking.forward_cost import Shape, _attending, _prefilled
    from sbd.decoding.attention import routed
    from sbd.decoding.cache import crop
    from sbd.decoding.llama_forward import LlamaForward
    from sbd.drafters.adapter import gated
    from sbd.models import extension

    extension.build()
    torch.set_num_threads(2)
    model, _ = sbd.load("smollm2")
    lean = LlamaForward(model)
    gen = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    forms = [(1, 1), (2, 2), (2, 1), (4, 4), (4, 1)]  # (width, committed)
    times = {f: [] for f in forms}
    with torch.inference_mode():
        cache, pad = _prefilled(model, 1, 256, 8, torch.device("cpu"), gen)
        calls = []
        for w, c in forms:
            s = Shape(1, w, 256, n_commit=c)
            ids = torch.randint(3, vocab, (1, w), generator=gen)
            kw = _attending(model, s, dict(input_ids=ids, position_ids=(256 + torch.arange(w))[None]), pad, 256)
            calls.append(((w, c), s, kw))
        for round_ in range(33):
            for f, s, kw in calls:
                start = time.perf_counter()
                with gated(model, s.commit if s.commit < s.width else None), routed(model, True):
                    lean(kw["input_ids"], kw["position_ids"], cache, kw["sbd_layout"], s.width)
                if round_ >= 3:
                    times[f].append(time.perf_counter() - start)
                crop(cache, s.width)
    print(f"SmolLM2-135M + drafter, defaults, 256 cached, batch 1, 2 threads, torch {torch.__version__}")
    print("| w | committed | masks | ms |")
    print("|---:|---:|---:|---:|")
    for (w, c), t in times.items():
        print(f"| {w} | {c} | {w - c} | {1e3 * statistics.median(t):.2f} |")


if __name__ == "__main__":
    main()
