"""Adaptive drafts cut by the drafter's confidence (`DraftOptions.refusal_cost`), against not cut, interleaved.

Why: in sbd-verify a refused draft costs more than its refused tokens: the masks behind it drafted for the
wrong places, so the next forward has no draft and yields one token. With adaptive drafting each masks'
draft is now cut before the place the drafter is unsure of (`sbd.decoding.draft_lengths.confident_length`); this
measures that against the same code with the cut off, on the same prompts, configurations taking turns
on every batch. The answers are the model's greedy answers either way; the script counts them.

    python benchmarks/confidence_cut.py demo                   # 90 demo problems, batch 1 and 8
    python benchmarks/confidence_cut.py smollm2 --n 12         # SmolLM2 + adapter, its defaults
"""

from __future__ import annotations

import argparse
import time

import torch


def run(model, tok, prompts, refusals, batch: int, max_new: int, head_chains: bool = False, **kw) -> dict:
    """Every refusal cost on every batch of prompts, interleaved; totals per setting. head_chains: cut
    the sampler head's chains too."""
    import sbd
    from sbd.decoding.draft_policy import DraftOptions

    totals = {r: {"nfe": 0, "tokens": 0, "seconds": 0.0, "answers": []} for r in refusals}
    sbd.generate(model, tok, prompts[:batch], method="sbd-verify", max_new_tokens=8, **kw)  # warm-up, width costs
    for i in range(0, len(prompts), batch):
        for refusal in refusals:
            options = DraftOptions(refusal_cost=refusal, cut_head_chains=head_chains)
            t = time.perf_counter()
            r = sbd.generate(model, tok, prompts[i : i + batch], method="sbd-verify", max_new_tokens=max_new,
                             draft_options=options, **kw)
            tot = totals[refusal]
            tot["seconds"] += time.perf_counter() - t
            tot["nfe"] += sum(r.nfe)
            tot["tokens"] += sum(len(x) for x in r.token_ids)
            tot["answers"] += r.token_ids
    return totals


def report(title: str, totals: dict) -> None:
    ref = totals[None]
    print(f"\n{title}\n\n| adaptive drafts | tokens / forward | time vs not cut | same answers as not cut |\n"
          "|---|---:|---:|---:|")
    for refusal, t in totals.items():
        name = "not cut" if refusal is None else f"cut, refusal cost {refusal:g}"
        same = sum(a == b for a, b in zip(t["answers"], ref["answers"]))
        print(f"| {name} | {t['tokens'] / t['nfe']:.3f} | {t['seconds'] / ref['seconds']:.3f} | "
              f"{same}/{len(ref['answers'])} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=("demo", "smollm2"))
    ap.add_argument("--n", type=int, default=12, help="smollm2: the first N prompts of --prompts")
    ap.add_argument("--prompts", default="runs/campaign/eval24/heldout_gsm.jsonl", help="smollm2: a prompt file")
    ap.add_argument("--refusals", default="0.5,1", help="refusal costs to try besides not cut")
    ap.add_argument("--head-chains", action="store_true",
                    help="smollm2: also cut the chains its sampler head draws "
                         "(DraftOptions.cut_head_chains; off by default)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import sbd

    refusals = [None] + [float(x) for x in args.refusals.split(",")]
    if args.model == "demo":
        from sbd.cli.eval import parse_tasks
        from sbd.tasks import make_split

        model, tok = sbd.load("demo")
        prompts = [e["prompt"] for t in parse_tasks("chain_sum,number_sorting,word_sequence_reversal")
                   for e in make_split(t, "test", 30, 0)]
        for batch in (1, 8):
            totals = run(model, tok, prompts, refusals, batch, 112, block_size=8, draft="adaptive")
            report(f"demo model, 90 problems, block 8, adaptive drafts, batch {batch}", totals)
    else:
        from sbd.decoding.generate import encode_prompts
        from sbd.tasks.prompts import load_prompts

        model, tok = sbd.load("smollm2")
        prompts = encode_prompts(tok, load_prompts(args.prompts)[: args.n], chat=True)
        totals = run(model, tok, prompts, refusals, 1, 128, head_chains=args.head_chains)
        cut = "head chains cut too" if args.head_chains else "head chains not cut (the default)"
        report(f"SmolLM2 + adapter and sampler head, its defaults (lookup, else the head's chain, adaptive; {cut}), "
               f"{args.n} prompts of {args.prompts}, batch 1", totals)


if __name__ == "__main__":
    main()
