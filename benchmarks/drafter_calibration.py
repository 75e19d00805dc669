"""Is the drafter's probability the chance that its token stands? The calibration adaptive drafting relies on.

`sbd.decoding.draft_lengths.confident_length` cuts a draft by reading each draft token's drafting probability (the
masks' softmax; with a sampler head, the head's softmax over the masks' top candidates) as the chance
that the next-token head keeps it, once the tokens before it were kept. This counts, per probability
bucket, how often that held, over whole-block drafts (width made free and the refusal cost 0, so that no
draft is cut and every place is tried).

    python benchmarks/drafter_calibration.py demo
    python benchmarks/drafter_calibration.py smollm2 --n 12
"""

from __future__ import annotations

import argparse
import importlib
from collections import defaultdict

import torch


def collect(model, tok, prompts, max_new: int, block_size: int) -> tuple[dict[int, list[int]], dict[str, int]]:
    """{bucket (tenths): [draft tokens tried there, of which kept]} over every verified masks' draft, and
    counts of forwards, of those with no draft (after a refusal) and of drafts kept in full."""
    import sbd
    from sbd.decoding.draft_policy import DraftOptions
    from sbd.decoding.rows import VerifyRow

    gen = importlib.import_module("sbd.decoding.generate")
    gen.forward_costs = lambda m, batch=1: (lambda w: 1.0)  # free width: adaptive drafts whole blocks
    # with free width and no refusal cost nothing is cut, so every place is tried; the head's
    # probabilities are read too
    options = DraftOptions(refusal_cost=0.0, cut_head_chains=True)
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    forwards = {"forwards": 0, "with no draft": 0, "drafts": 0, "drafts kept in full": 0}
    base = VerifyRow.answer

    def answer(self, values):
        draft, probs = list(self.draft), getattr(self, "_probs_of_draft", None)
        prefill = self.in_prefill
        out = base(self, values)
        if not prefill:
            forwards["forwards"] += 1
            forwards["with no draft"] += not draft
            forwards["drafts"] += bool(draft)
            forwards["drafts kept in full"] += bool(draft) and self.accepted[-1] == len(draft)
        if draft and probs is not None and len(self.accepted) and not getattr(self, "_was_lookup", False):
            kept = self.accepted[-1]
            for i, p in enumerate(probs[: min(kept + 1, len(draft))]):  # tried: up to the first refused one
                bucket = counts[min(int(p * 10), 9)]
                bucket[0] += 1
                bucket[1] += i < kept
        probs = self.chain.probs
        self._probs_of_draft = probs[: len(self.draft)] if probs is not None else None
        self._was_lookup = self.from_lookup
        return out

    VerifyRow.answer = answer
    try:
        for p in prompts:
            sbd.generate(model, tok, [p], method="sbd-verify", draft="adaptive", lookup=False, tree="chain",
                         block_size=block_size, max_new_tokens=max_new, draft_options=options)
    finally:
        VerifyRow.answer = base
    return counts, forwards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=("demo", "smollm2"))
    ap.add_argument("--n", type=int, default=12, help="smollm2: the first N prompts of --prompts")
    ap.add_argument("--prompts", default="runs/campaign/eval24/heldout_gsm.jsonl", help="smollm2: a prompt file")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import sbd

    if args.model == "demo":
        from sbd.cli.eval import parse_tasks
        from sbd.tasks import make_split

        model, tok = sbd.load("demo")
        prompts = [e["prompt"] for t in parse_tasks("chain_sum,number_sorting,word_sequence_reversal")
                   for e in make_split(t, "test", 30, 0)]
        (counts, forwards), title = collect(model, tok, prompts, 112, 8), "demo model, its masks, 90 problems, block 8"
    else:
        from sbd.decoding.generate import encode_prompts
        from sbd.tasks.prompts import load_prompts

        model, tok = sbd.load("smollm2")
        prompts = encode_prompts(tok, load_prompts(args.prompts)[: args.n], chat=True)
        counts, forwards = collect(model, tok, prompts, 128, 8)
        title = f"SmolLM2 + adapter, its sampler head's picks, {args.n} prompts of {args.prompts}, block 8"
    print(f"{title}\n\n| drafting probability | draft tokens tried | kept |\n|---|---:|---:|")
    for b in sorted(counts):
        tried, kept = counts[b]
        print(f"| {b / 10:.1f}–{(b + 1) / 10:.1f} | {tried} | {kept / tried:.0%} |")
    print("\n" + "; ".join(f"{k}: {v}" for k, v in forwards.items()))


if __name__ == "__main__":
    main()
