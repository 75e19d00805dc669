"""Which path distils SmolLM2's greedy answers fastest on this machine, still exactly greedy?

Candidates, timed interleaved in one process on the same prompts (answer tokens per second):
- HF: Hugging Face `generate`, greedy, a left-padded batch (finished rows keep computing until the
  longest answer ends);
- sbd-ntp: our engine, next-token decoding, rows leave as they finish;
- sbd-verify-lookup: our engine, sbd-verify with the shipped adapter's drafts and lookup (exactly the
  model's greedy tokens by construction, several tokens per forward when drafts stand).
Every candidate's tokens are compared with sbd-ntp's, row by row.

    python benchmarks/smollm2/campaign/distill_speed.py --prompts runs/campaign/prompts.jsonl --n 16 \
        --batch-size 16 --max-new-tokens 128 --out benchmarks/smollm2/campaign/results/distill_speed.md
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import sbd
from sbd.decoding.generate import encode_prompts
from sbd.models.facts import default_eos_ids


def hf_batch(model, tokenizer, ids, max_new, eos):
    width = max(len(p) for p in ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    x = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=attn, do_sample=False, max_new_tokens=max_new, pad_token_id=pad,
                             eos_token_id=eos)[:, width:].tolist()
    res = []
    for row in out:
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        res.append(row[:cut])
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    prompts = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines()[: args.n]]
    model, tokenizer = sbd.load("smollm2")
    ids = encode_prompts(tokenizer, prompts, chat=True)
    eos = default_eos_ids(model, tokenizer)
    B, M = args.batch_size, args.max_new_tokens
    batches = [ids[i: i + B] for i in range(0, len(ids), B)]

    def sbd_run(method, **kw):
        out = []
        for b in batches:
            out += sbd.generate(model, tokenizer, b, method=method, max_new_tokens=M, **kw).token_ids
        return out

    def hf_run():
        out = []
        for b in batches:
            out += hf_batch(model, tokenizer, b, M, eos)
        return out

    runs = {"HF generate (batched)": hf_run, "sbd ntp": lambda: sbd_run("ntp"),
            "sbd-verify + lookup": lambda: sbd_run("sbd-verify", lookup=True, block_size=4)}
    times = {k: [] for k in runs}
    outs = {}
    sbd_run("ntp")  # warm-up
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t = time.perf_counter()
            outs[name] = fn()
            times[name].append(time.perf_counter() - t)
    ref = outs["sbd ntp"]
    n_tok = sum(len(r) for r in ref)
    lines = [f"# Distillation speed on SmolLM2-135M-Instruct ({platform.processor() or platform.machine()}, "
             f"{args.threads} threads, torch {torch.__version__})", "",
             f"{len(ids)} campaign prompts, batch {B}, ≤ {M} new tokens, greedy, median of {args.repeats} "
             f"interleaved runs; {n_tok} answer tokens.", "",
             "| path | seconds | answer tokens/s | vs sbd ntp | rows equal to sbd ntp |", "|---|---:|---:|---:|---:|"]
    base = statistics.median(times["sbd ntp"])
    for name in runs:
        t = statistics.median(times[name])
        same = sum(a == b for a, b in zip(outs[name], ref))
        lines.append(f"| {name} | {t:.1f} | {n_tok / t:.0f} | {base / t:.2f}x | {same}/{len(ref)} |")
    lines += ["", "Command: `python benchmarks/smollm2/campaign/distill_speed.py " + " ".join(argv or __import__("sys").argv[1:]) + "`"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
