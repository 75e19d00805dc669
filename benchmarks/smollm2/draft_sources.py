"""Which source drafted the tokens sbd-verify kept: the masked head (the adapter) or prompt lookup.
Forward counts only (no timing: `sbd bench` times), greedy, batch 1, through the chat template; every
output is checked against the model's own NTP decoding.

    python benchmarks/smollm2/draft_sources.py --model smollm2 --prompts PROMPTS.jsonl [--n 4]
        [--block-size 4,8] [--max-new-tokens 128] [--out FILE.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--block-size", default="4,8")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import sbd
    from sbd.decoding.generate import encode_prompts
    from sbd.tasks.prompts import load_prompts

    model, tok = sbd.load(args.model)
    ids = encode_prompts(tok, load_prompts(args.prompts)[: args.n], chat=True)
    ntp = sbd.generate(model, tok, ids, method="ntp", max_new_tokens=args.max_new_tokens)
    lines = [f"Draft sources of sbd-verify: {args.model}, {len(ids)} prompts from {Path(args.prompts).name}, greedy, "
             f"batch 1, at most {args.max_new_tokens} new tokens; {ntp.num_tokens} tokens in all.", "",
             "| drafts | block | forwards | tokens / forward | kept draft tokens | from the masks | from lookup "
             "| identical to NTP |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for k in (int(x) for x in args.block_size.split(",")):
        for lookup in (False, True):
            runs = [sbd.generate(model, tok, [p], method="sbd-verify", block_size=k, lookup=lookup,
                                 draft="block", tree="chain", max_new_tokens=args.max_new_tokens) for p in ids]
            nfe, tokens = sum(r.nfe[0] for r in runs), sum(r.num_tokens for r in runs)
            kept = sum(sum(r.accepted[0]) for r in runs)
            looked = sum(r.lookup_accepted[0] for r in runs)
            same = sum(r.token_ids[0] == t for r, t in zip(runs, ntp.token_ids))
            name = "lookup, else masks" if lookup else "masks"
            lines.append(f"| {name} | {k} | {nfe} | {tokens / nfe:.2f} | {kept} | {kept - looked} | {looked} "
                         f"| {same}/{len(ids)} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
