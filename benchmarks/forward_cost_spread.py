"""How steady is the forward-cost table adaptive drafting reads? The same table timed several times in a row,
with two rules for turning a width's repeated timings into one: the median of three (what `width_cost` uses)
and the fastest of five, taking turns in one process.

    python benchmarks/forward_cost_spread.py --model smollm2 --tables 4 --out benchmarks/results/forward_cost_spread.md

Reported per width: each table's time(w)/time(1) and the spread (largest / smallest) over the tables. A table
that moves from one timing to the next moves adaptive drafting's draft lengths with it (never its tokens).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

RULES = {"median of 3": (statistics.median, 3), "fastest of 5": (min, 5)}
SHOWN = (2, 4, 9, 16, 17, 33)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="a model sbd.load takes (default: smollm2)")
    p.add_argument("--tables", type=int, default=4, help="tables timed per rule (default: 4)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the timed forwards (default: 1)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    p.add_argument("--out", default=None, help="markdown file for the table")
    args = p.parse_args()

    import torch

    import sbd
    from sbd.decoding.forward import ModelForward
    from sbd.decoding.width_cost import _cpu_name, _measure

    torch.set_num_threads(args.threads)
    model, _ = sbd.load(args.model)
    forward = ModelForward(model)
    tables: dict[str, list[dict[int, float]]] = {name: [] for name in RULES}
    for i in range(args.tables):
        for name in RULES if i % 2 == 0 else reversed(RULES):  # the rules take turns
            pick, repeats = RULES[name]
            tables[name].append(_measure(forward, args.batch, 64, repeats, pick=pick))
            print(f"table {i + 1} {name} done", flush=True)
    lines = [f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {_cpu_name()}, {os.cpu_count()} cores, "
             f"{args.threads} threads; model {args.model}, batch {args.batch}, 64 cached tokens, {args.tables} tables per "
             f"rule, rules in turn.\n",
             f"    python benchmarks/forward_cost_spread.py --model {args.model} --tables {args.tables}\n",
             "| rule | width | time(w)/time(1), table by table | spread |", "|---|---:|---|---:|"]
    for name, ts in tables.items():
        for w in SHOWN:
            values = [t[w] for t in ts]
            lines.append(f"| {name} | {w} | {' '.join(f'{v:.2f}' for v in values)} | {max(values) / min(values):.2f}x |")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
