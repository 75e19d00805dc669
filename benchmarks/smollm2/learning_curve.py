"""Held-out tokens per forward of sbd-verify for every checkpoint of an adapter run, against sequences
seen: the learning curve of the drafts. Greedy, batch 1, through the chat template; the tokens are
checked against the original model's (NTP) output on the way.

    python benchmarks/smollm2/learning_curve.py RUN_DIR PROMPTS.jsonl [--n 6] [--block-size 8] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("prompts")
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import sbd
    from sbd import adapter as adapters
    from sbd.decoding.generate import encode_prompts
    from sbd.tasks.prompts import load_prompts

    run = Path(args.run)
    settings = json.loads((run / "sbd_train.json").read_text())
    per_step = settings["batch_size"] * settings.get("grad_accum", 1)
    base_dir = adapters.read_config(next(run.glob("checkpoint-*"))).base_model_name_or_path
    model, tok = sbd.load(base_dir)
    ids = encode_prompts(tok, load_prompts(args.prompts)[: args.n], chat=True)
    ref = [sbd.generate(model, tok, [p], method="ntp", max_new_tokens=args.max_new_tokens).token_ids[0] for p in ids]
    rows = []
    points = sorted(run.glob("checkpoint-*"), key=lambda p: int(re.sub(r"\D", "", p.name)))
    for ck in points:
        adapters.load(model, ck)
        tokens = nfe = same = 0
        for p, r in zip(ids, ref):
            out = sbd.generate(model, tok, [p], method="sbd-verify", block_size=args.block_size,
                               max_new_tokens=args.max_new_tokens)
            tokens, nfe, same = tokens + out.num_tokens, nfe + out.nfe[0], same + (out.token_ids[0] == r)
        adapters.detach(model)
        step = int(ck.name.split("-")[1])
        rows.append((step, step * per_step, tokens / nfe, same))
        print(f"step {step}: {step * per_step} sequences seen, {tokens / nfe:.2f} tokens per forward, "
              f"{same}/{len(ids)} identical to NTP", flush=True)
    lines = [f"sbd-verify learning curve: {run}, {len(ids)} held-out prompts from {args.prompts}, block "
             f"{args.block_size}, greedy, batch 1, at most {args.max_new_tokens} new tokens.", "",
             "| step | sequences seen | tokens per forward | identical to NTP |", "|---:|---:|---:|---:|"]
    lines += [f"| {s} | {q} | {t:.2f} | {m}/{len(ids)} |" for s, q, t, m in rows]
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
