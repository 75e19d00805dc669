"""What the sampler head's drafting table costs per verifying forward, with and without its state, at
SmolLM2-135M's shape (random tensors: the cost does not depend on the values), one CPU thread.

    python benchmarks/smollm2/head_table_cost.py [--positions 15] [--repeats 200]

The two heads are timed interleaved in one process; medians in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sbd.drafters import sampler_head as heads


class _Tables(torch.nn.Module):
    """The two tables `draft_table` reads, SmolLM2's sizes."""

    def __init__(self, vocab=49153, hidden=576):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.out = torch.nn.Linear(hidden, vocab, bias=False)

    def get_input_embeddings(self):
        return self.emb

    def get_output_embeddings(self):
        return self.out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=15, help="draft positions per table")
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tables = _Tables()
    heads.attach(tables)
    plain = heads.head_of(tables)
    state = heads.SamplerHead(heads.SamplerHeadConfig(hidden_size=576, vocab_size=49153, state=True))
    for h in (plain, state):
        with torch.no_grad():
            for p in h.parameters():
                p.normal_(0, 0.02)
    hidden = torch.randn(args.positions, 576)
    logits = tables.out(hidden).detach()
    first = torch.tensor(5)
    times = {"stateless": [], "state": []}
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, h in (("stateless", plain), ("state", state)):
                t = time.perf_counter()
                heads.walk(heads.draft_table(h, tables, hidden, logits, first).tolist(), args.positions)
                times[name].append(time.perf_counter() - t)
    for name, ts in times.items():
        print(f"{name}: {1000 * statistics.median(ts[10:]):.2f} ms median over {len(ts) - 10} "
              f"({args.positions} positions, top {plain.config.top_k}, width {plain.config.width}, 1 thread)")


if __name__ == "__main__":
    main()
