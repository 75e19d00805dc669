"""The masks' drafts in vLLM equal sbd's own gated adapter under a causal mask (either venv).

    python tests/vllm/hf_mask_parity.py MODEL trace.jsonl [--limit 200]

trace.jsonl: written by the plug-in's proposer (SBD_VLLM_TRACE, `run_vllm.py --trace`) with sbd-verify
drafts (lookup off, no sampler head). For every step whose previous draft was [d.., MASK x k] and whose
d all stood, the new draft's chain must be the argmax (mask token excluded) of masks 2..k of the forward
context + d + MASK x k, computed here with Hugging Face and `sbd.drafters.adapter.gated` - with a causal mask,
because vLLM's CPU attention gives the masks no bidirectional block (the drafts then differ from sbd's
own engine, the outputs never).
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch


def check(model_dir, trace_path, limit: int = 200, show: int = 5) -> tuple[int, int]:
    """(mask drafts checked, how many equal Hugging Face's)."""
    from transformers import AutoModelForCausalLM

    from sbd.drafters import adapter

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    adapter.load(model, Path(model_dir) / "sbd_adapter")
    mask_id = model.config.sbd_mask_token_id
    by_req = defaultdict(list)
    with open(trace_path) as f:
        for line in f:
            e = json.loads(line)
            by_req[e["req"]].append(e)
    checked = agree = 0
    for steps in by_req.values():
        for prev, cur in zip(steps, steps[1:]):
            k = sum(1 for t in prev["draft"] if t == mask_id)
            d = prev["draft"][: len(prev["draft"]) - k]
            chain = [t for t in cur["draft"] if t != mask_id] if mask_id in cur["draft"] else None
            if k < 2 or chain is None or len(cur["sampled"]) != len(d) + 1 or checked >= limit:
                continue
            feed = prev["context"] + d + [mask_id] * k
            start = len(prev["context"]) + len(d)
            with torch.no_grad(), adapter.gated(model, start):
                logits = model(torch.tensor([feed])).logits[0, start + 1 :].float()
            logits[:, mask_id] = torch.finfo(logits.dtype).min
            want = logits.argmax(-1).tolist()[: len(chain)]
            checked += 1
            agree += want == chain
            if want != chain and checked - agree <= show:
                print("differs:", {"context_len": len(prev["context"]), "vllm": chain, "hf": want})
    return checked, agree


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("trace")
    ap.add_argument("--limit", type=int, default=200)
    args = ap.parse_args()
    checked, agree = check(args.model, args.trace, args.limit)
    print(f"mask drafts checked: {checked}, equal to sbd's gated adapter (causal): {agree}")
    raise SystemExit(0 if checked and agree == checked else 1)


if __name__ == "__main__":
    main()
