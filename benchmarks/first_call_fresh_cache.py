"""How long the first `sbd.generate` of a process takes on a machine that never decoded the model before
(an empty cost cache), against the same call right after it: what the first call pays beyond its decoding.
Each checkout runs in its own process (PYTHONPATH), each with its own empty `$SBD_COSTS_CACHE`.

    python benchmarks/first_call_fresh_cache.py --old OLD --out benchmarks/results/first_call_fresh_cache.md

OLD: a worktree of an earlier commit (`git worktree add OLD COMMIT`); the new side is this checkout."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
PROMPTS = ["What is 7 * 8? Explain.", "Write a python function that adds two numbers.",
           "Name three colours and say why the sky is blue.", "List the planets of the solar system in order."]


def worker(batch: int, tokens: int) -> None:
    import warnings

    import torch

    import sbd

    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    model, tok = sbd.load("smollm2")
    times, out = [], []
    for _ in range(2):
        start = time.perf_counter()
        r = sbd.generate(model, tok, PROMPTS[:batch], max_new_tokens=tokens, chat=True)
        times.append(time.perf_counter() - start)
        out.append(r.token_ids)
    print(json.dumps({"first": times[0], "second": times[1], "same": out[0] == out[1], "tokens": out[0]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.batch, args.max_new_tokens)
    rows = {}
    for name, checkout in (("old", args.old.resolve()), ("new", HERE.parent.parent)):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "PYTHONPATH": str(checkout), "SBD_COSTS_CACHE": cache}
            done = subprocess.run([sys.executable, str(HERE), "--old", str(args.old), "--out", str(args.out),
                                   "--worker", "--batch", str(args.batch), "--max-new-tokens", str(args.max_new_tokens)],
                                  env=env, capture_output=True, text=True, check=True)
            rows[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(name, {k: v for k, v in rows[name].items() if k != "tokens"}, file=sys.stderr)
    import torch

    from sbd.decoding.width_cost import _cpu_name

    lines = ["# The first sbd.generate on an empty cost cache", "",
             f"Command: `python benchmarks/first_call_fresh_cache.py --old OLD --batch {args.batch} --max-new-tokens "
             f"{args.max_new_tokens} --out {args.out}`", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {_cpu_name()}, 2 threads, torch {torch.__version__}. "
             f"SmolLM2-135M-Instruct with its shipped drafter, its defaults (sbd-verify, adaptive drafts), "
             f"{args.batch} chat prompts as one batch, {args.max_new_tokens} new tokens; each checkout in a fresh "
             "process with an empty cost cache; the same call twice.", "",
             "| checkout | first call s | second call s | first − second s | same tokens both calls |",
             "|---|---:|---:|---:|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['first']:.1f} | {r['second']:.1f} | {r['first'] - r['second']:.1f} | "
                     f"{'yes' if r['same'] else 'no'} |")
    lines += ["", f"Old and new gave the same tokens: {'yes' if rows['old']['tokens'] == rows['new']['tokens'] else 'no'}."]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
