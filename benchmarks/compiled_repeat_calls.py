"""Does `compile=True` pay on repeat calls? SmolLM2 with its shipped adapter (masks alone: a compiled step
cannot run the sampler head), sbd-verify's defaults otherwise, batch 1: eager, eager on static shapes, and
compiled, taking turns prompt by prompt in one process after one warm-up call each (the compile).

    python benchmarks/compiled_repeat_calls.py --rounds 3 --out benchmarks/results/compiled_repeat_calls

Static shapes pad every forward to one of a few widths (what a compiled graph needs); what that padding
costs is the difference between the first two columns, what compiling gains the difference between the last
two. Writes results.md (medians per configuration, ms per forward) with the command and the machine."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

from machine_name import machine

PROMPTS = ["What is 7 * 8? Explain.", "Write a python function that adds two numbers.",
           "Name three colours and say why the sky is blue.", "A train leaves at 3 pm and rides 2 hours. When does it arrive?"]
CONFIGS = {"eager": {}, "eager, static shapes": {"static_shapes": True}, "compiled": {"compile": True}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", default="results", help="the result file's name (default: results)")
    args = ap.parse_args()

    import torch

    import sbd

    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    model, tok = sbd.load("smollm2", sampler_head=False, weights="float")
    run = {}
    def generate(prompts, kw):
        """compile=True is refused where sbd's eager forward runs its C++ decoder layers (a CPU): the compiled
        step never ran them, so it is timed with them switched off, against eager forwards that run them."""
        os.environ["SBD_NATIVE"] = "0" if kw.get("compile") else native
        try:
            return sbd.generate(model, tok, prompts, max_new_tokens=args.max_new_tokens, chat=True, **kw)
        finally:
            os.environ["SBD_NATIVE"] = native

    native = os.environ.get("SBD_NATIVE", "1")
    for name, kw in CONFIGS.items():
        start = time.perf_counter()
        generate(PROMPTS[:1], kw)
        run[name] = {"first": time.perf_counter() - start, "ms": [], "tokens": [], "seconds": []}
        print(f"{name}: first call {run[name]['first']:.1f} s", file=sys.stderr, flush=True)
    same = True
    for r in range(args.rounds):
        for p in PROMPTS:
            ids = None
            for name, kw in CONFIGS.items():
                out = generate([p], kw)
                run[name]["ms"].append(1000 * out.seconds / out.nfe[0])
                run[name]["tokens"].append(out.num_tokens)
                run[name]["seconds"].append(out.seconds)
                same &= ids is None or out.token_ids == ids
                ids = out.token_ids
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    base = statistics.median(run["eager"]["seconds"])
    lines = ["# compile=True on repeat calls, SmolLM2-135M-Instruct + shipped adapter (masks alone)", "",
             f"Command: `python benchmarks/compiled_repeat_calls.py --rounds {args.rounds} --out {args.out} --name {args.name}`  ",
             f"Machine: {machine()}, {args.threads} threads, torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  ",
             f"{len(PROMPTS)} chat prompts x {args.rounds} rounds, batch 1, greedy, {args.max_new_tokens} new tokens, "
             f"configurations in turns per prompt; same tokens in every configuration: {same}", "",
             "| configuration | first call s | median s per answer | slowest repeat call s | median ms per forward "
             "| vs eager (median s) |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in run.items():
        med = statistics.median(r["seconds"])
        lines.append(f"| {name} | {r['first']:.1f} | {med:.3f} | {max(r['seconds']):.2f} | "
                     f"{statistics.median(r['ms']):.1f} | {base / med:.2f}x |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
