"""The first `sbd.generate` call at each batch size, in a fresh process: how long a caller waits while adaptive
drafting learns this machine's forward costs, against the same call once more.

    python benchmarks/first_call.py --model smollm2 --batches 1,5,11,16 --out benchmarks/results/first_call.md

Three fresh processes, one after another: "every batch timed" (no cost cache on disk and every new batch
size timed, as before costs were kept: `ESTIMATE_NEW_BATCHES = False`), "new machine" (no cost cache; the
first batch size is timed, later ones start from it), and "later process" (the costs the previous process
kept on disk). Each process makes the first call at each batch size, then the same call again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
import sbd
from sbd.decoding import width_cost
torch.set_num_threads(int(sys.argv[4]))
width_cost.ESTIMATE_NEW_BATCHES = sys.argv[3] == "estimate"
model, tok = sbd.load(sys.argv[1])
prompts = [f"What is {i} + {2 * i}? Answer with the number." for i in range(32)]
out = {}
for b in map(int, sys.argv[2].split(",")):
    times = []
    for _ in range(2):
        t = time.perf_counter()
        sbd.generate(model, tok, prompts[:b], chat=True, max_new_tokens=16)
        times.append(time.perf_counter() - t)
    out[b] = times
print(json.dumps(out))
"""


def run(model: str, batches: str, estimate: bool, cache: Path, threads: int) -> dict:
    env = dict(os.environ, SBD_COSTS_CACHE=str(cache))
    done = subprocess.run([sys.executable, "-c", CHILD, model, batches, "estimate" if estimate else "time", str(threads)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batches", default="1,5,11,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        runs["every batch timed (before)"] = run(args.model, args.batches, False, Path(a), args.threads)
        runs["new machine"] = run(args.model, args.batches, True, Path(b), args.threads)
        runs["later process"] = run(args.model, args.batches, True, Path(b), args.threads)
    from sbd.decoding.width_cost import _cpu_name

    batches = args.batches.split(",")
    lines = ["# The first sbd.generate call per batch size, in a fresh process", "",
             f"Command: `python {' '.join(sys.argv)}`", "",
             f"{time.strftime('%Y-%m-%d')}, {_cpu_name()}, {args.threads} threads, model {args.model} (its defaults: "
             "adaptive drafting), 16 new tokens, chat template. Seconds: first call / the same call again.", "",
             "| process | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---:|" * len(batches)]
    for name, r in runs.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[b][0]:.1f} / {r[b][1]:.1f}" for b in batches) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
