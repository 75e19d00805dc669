"""Tree drafts against chain drafts: SmolLM2-135M-Instruct with its shipped adapter, greedy,
batch 1, through the chat template. Tokens per forward and wall time of each configuration, against
Hugging Face greedy `generate` and Hugging Face prompt-lookup, in one process, configurations interleaved
prompt by prompt; every output checked against the model's own greedy tokens.

    python benchmarks/smollm2/tree_drafts.py --prompts runs/campaign/eval/heldout_gsm.jsonl --n 6 \
        --configs "chain;tree=2;tree=3,2;tree=3,2,1;tree=4,2,2,1" --out FILE.md

A configuration is `;`-separated, with `+`-joined settings: chain, tree=W1,W2,…, lookup, adaptive,
block=K, lookup_max=N (the longest lookup draft), reuse (after a refused draft, draft from its later places rather than afresh; noreuse: the
default), nohead (the adapter's sampler head left off, when the adapter has one), fixedlookup (with
adaptive drafts, every lookup draft `lookup_max` long, as before session 6), flinear (torch's own linear
layers instead of sbd's narrow ones), e.g. "tree=3,2+lookup+adaptive"; what a configuration does not
name is off (whole blocks, no lookup, a chain). "defaults" alone: the settings the model records as its
defaults (sbd.decoding.defaults), which may take "+nohead", "+fixedlookup", "+flinear"; "ntp": our NTP
loop (every forward one token wide), which may take "+flinear".
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch


def parse(config: str, block: int) -> dict:
    """`generate` keyword arguments of one configuration string."""
    first, *rest = config.split("+")
    if first in ("defaults", "ntp"):  # what the model records (sbd.decoding.defaults), its block size; our NTP loop
        kw = {"method": "sbd-verify" if first == "defaults" else "ntp"}
        for part in rest:
            if part not in ("nohead", "fixedlookup", "flinear") or (first == "ntp" and part != "flinear"):
                raise SystemExit(f"unknown setting {part!r} in {config!r}")
            kw.update({"nohead": {"sampler_head": False}, "fixedlookup": {"fixed_lookup": True},
                       "flinear": {"flinear": True}}[part])
        return kw
    # every setting explicit: the model's recorded defaults must not leak into a named configuration
    kw = {"method": "sbd-verify", "block_size": block, "draft": "block", "lookup": False, "tree": "chain"}
    for part in config.split("+"):
        if part == "chain":
            continue
        if part == "fixedlookup":
            kw["fixed_lookup"] = True
        elif part == "flinear":
            kw["flinear"] = True
        elif part.startswith("tree="):
            kw["tree"] = part[5:]
        elif part == "lookup":
            kw["lookup"] = True
        elif part == "adaptive":
            kw["draft"] = "adaptive"
        elif part == "reuse":  # after a refusal, draft from the refused draft's rest instead of afresh
            kw["reuse_leftover"] = True
        elif part == "noreuse":  # after a refusal, draft afresh (the default)
            kw["reuse_leftover"] = False
        elif part.startswith("lookup_max="):  # the longest lookup draft
            kw["lookup_max"] = int(part[11:])
        elif part.startswith("block="):
            kw["block_size"] = int(part[6:])
        elif part == "nohead":  # the masks' drafts without the sampler head's rescoring
            kw["sampler_head"] = False
        else:
            raise SystemExit(f"unknown setting {part!r} in {config!r}")
    return kw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--configs", default="chain;tree=2;tree=3,2;tree=3,2,1;tree=4,2,2,1")
    ap.add_argument("--no-timing", action="store_true", help="forwards only (one pass, no HF baselines)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import sbd
    from sbd.benchmarking.ties import near_ties
    from sbd.decoding.draft_policy import DraftOptions
    from sbd.decoding.generate import encode_prompts
    from sbd.models.narrow_linear import linear_layers
    from sbd.drafters.sampler_head import enabled
    from sbd.tasks.prompts import load_prompts

    model, tok = sbd.load(args.model, weights="float")  # trees: float layers
    ids = encode_prompts(tok, load_prompts(args.prompts)[: args.n], chat=True)
    configs = [c.strip() for c in args.configs.split(";") if c.strip()]
    ref, hf_t, pl_t, pln_t = [], [], [], []
    stats = {c: {"nfe": 0, "tokens": 0, "same": 0, "t": [], "answers": []} for c in configs}

    def hf(p, lookup, stock=True):
        """HF generate on torch's own linear layers (stock transformers, what a user runs without sbd), or
        on sbd's narrow ones (`stock=False`: prompt-lookup's verifying forwards made cheaper by sbd)."""
        x = torch.tensor([p])
        kw = {"prompt_lookup_num_tokens": 10} if lookup else {}
        t0 = time.perf_counter()
        with torch.no_grad(), linear_layers(model, False if stock else None):
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, pad_token_id=tok.eos_token_id, **kw)
        return out[0, len(p):].tolist(), time.perf_counter() - t0

    def run(c, p, max_new):
        kw = parse(c, args.block_size)
        options = DraftOptions(reuse_leftover=kw.pop("reuse_leftover", False),
                               adaptive_lookup=not kw.pop("fixed_lookup", False))
        with enabled(model, kw.pop("sampler_head", True)), linear_layers(model, False if kw.pop("flinear", False) else None):
            t0 = time.perf_counter()
            r = sbd.generate(model, tok, [p], max_new_tokens=max_new, draft_options=options, **kw)
            return r, time.perf_counter() - t0

    for c in configs:  # warm-up, untimed: first calls, and adaptive drafting's one-off timing of forward widths
        run(c, ids[0], 8)
    hf(ids[0][:16], False)
    hf(ids[0][:16], True)
    hf(ids[0][:16], True, stock=False)
    for i, p in enumerate(ids):
        base, t = hf(p, False)  # the original model's greedy tokens, as stock transformers gives them
        ref.append(base)
        if not args.no_timing:
            hf_t.append(t)
            _, t = hf(p, True)
            pl_t.append(t)
            _, t = hf(p, True, stock=False)
            pln_t.append(t)
        for c in configs:
            r, dt = run(c, p, args.max_new_tokens)
            s = stats[c]
            s["nfe"] += r.nfe[0]
            s["tokens"] += len(r.token_ids[0])
            s["same"] += r.token_ids[0] == base
            s["answers"].append(r.token_ids[0])
            s["t"].append(dt)
        print(f"prompt {i + 1}/{len(ids)} done", flush=True)

    head = (f"sbd-verify drafts on {args.model}, {len(ids)} prompts of {Path(args.prompts).name}, "
            f"greedy, batch 1, chat template, at most {args.max_new_tokens} new tokens, block {args.block_size}; "
            f"{platform.machine()} {args.threads} threads, torch {torch.__version__}; configurations interleaved "
            "prompt by prompt; time = summed wall time over the prompts.")
    head += (" HF rows run on torch's own linear layers (stock transformers) unless marked 'on sbd's linear "
             "layers'; identical = token for token HF greedy's output (+ answers parting from it at a near tie, "
             "where float rounding decides: sbd/benchmarking/ties.py).")
    lines = [head, "", "| drafts | tokens / forward | identical to greedy | vs HF greedy (time) | vs HF prompt-lookup "
             "(time) | vs HF prompt-lookup on sbd's linear layers (time) |", "|---|---:|---:|---:|---:|---:|"]
    for c in configs:
        s = stats[c]
        tpf = s["tokens"] / max(1, s["nfe"])
        speeds = ["-"] * 3 if args.no_timing else [f"{sum(b) / sum(s['t']):.2f}x" for b in (hf_t, pl_t, pln_t)]
        ties = near_ties(model, ids, s["answers"], ref)
        same = f"{s['same']}/{len(ids)}" + (f" (+{ties} near tie{'s' * (ties > 1)})" if ties else "")
        lines.append(f"| {c} | {tpf:.2f} | {same} | " + " | ".join(speeds) + " |")
    if not args.no_timing:
        lines.append(f"| HF prompt-lookup (10) | - | - | {sum(hf_t) / sum(pl_t):.2f}x | 1.00x | {sum(pln_t) / sum(pl_t):.2f}x |")
        lines.append(f"| HF prompt-lookup (10) on sbd's linear layers | - | - | {sum(hf_t) / sum(pln_t):.2f}x | "
                     f"{sum(pl_t) / sum(pln_t):.2f}x | 1.00x |")
        lines += ["", f"Per-prompt median seconds: HF greedy {statistics.median(hf_t):.2f}, HF prompt-lookup "
                  f"{statistics.median(pl_t):.2f} (on sbd's layers {statistics.median(pln_t):.2f}); "
                  + ", ".join(f"{c} {statistics.median(stats[c]['t']):.2f}" for c in configs) + "."]
    text = "\n".join(lines)
    print(text)
    if args.out:
        cmd = "python benchmarks/smollm2/tree_drafts.py " + " ".join(
            f"--{a.replace('_', '-')} {v!r}" if isinstance(v, str) else f"--{a.replace('_', '-')} {v}"
            for a, v in vars(args).items() if v not in (None, False) and a != "out")
        Path(args.out).write_text(text + f"\n\nCommand: `{cmd}`\n")


if __name__ == "__main__":
    main()
