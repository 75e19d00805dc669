"""SBD-verify against its peers on one model: Hugging Face greedy `generate`, prompt-lookup decoding,
our NTP loop, plain SBD, and SBD-verify — same prompts, one process, configurations interleaved prompt
by prompt, one warm-up call each, medians over repeats.

    python benchmarks/verify_vs_peers.py --model demo --n 30 --repeats 3 --out benchmarks/results/verify_vs_peers.md

Columns: accuracy (reasoning-gym score), answers equal to HF greedy, forwards per answer (NFE; HF rows:
not counted), tokens per forward, tokens/s, wall-clock speedup against HF greedy.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path


def hf_generate(model, tokenizer, prompt: str, max_new: int, **kw):
    import torch

    ids = tokenizer(prompt, return_tensors="pt").input_ids
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **kw)
    seconds = time.perf_counter() - start
    new = out[0, ids.shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    for i, t in enumerate(new):
        if t in eos:
            new = new[: i + 1]
            break
    return new, tokenizer.decode(new, skip_special_tokens=True), None, seconds


def sbd_generate(model, tokenizer, prompt: str, max_new: int, **kw):
    import sbd

    r = sbd.generate(model, tokenizer, [prompt], max_new_tokens=max_new, **kw)
    return r.token_ids[0], r.texts[0], r.nfe[0], r.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="model folder, or demo (the shipped SBD-trained model)")
    ap.add_argument("--tasks", default="chain_sum,number_sorting,word_sequence_reversal")
    ap.add_argument("--n", type=int, default=30, help="held-out problems per task")
    ap.add_argument("--max-new-tokens", type=int, default=112)
    ap.add_argument("--gamma", type=float, default=0.35, help="γ of the plain SBD row")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the Markdown table here")
    args = ap.parse_args()

    import torch

    import sbd
    from sbd.tasks import make_split, score

    torch.set_num_threads(args.threads)
    model, tok = sbd.load(args.model)
    examples = [ex for t in args.tasks.split(",") for ex in make_split(t, "test", args.n, 0)]
    configs = {
        "HF greedy generate": (hf_generate, {}),
        "HF prompt-lookup (10)": (hf_generate, {"prompt_lookup_num_tokens": 10}),
        "sbd NTP loop": (sbd_generate, {"method": "ntp"}),
        f"SBD γ={args.gamma:g}, block 16": (sbd_generate, {"method": "sbd", "gamma": args.gamma, "block_size": 16}),
        "SBD-verify, block 16": (sbd_generate, {"method": "sbd-verify", "block_size": 16}),
        "SBD-verify, block 8": (sbd_generate, {"method": "sbd-verify", "block_size": 8}),
        f"SBD-verify, EB drafts γ={args.gamma:g}, block 16": (
            sbd_generate, {"method": "sbd-verify", "draft": "eb", "gamma": args.gamma, "block_size": 16}),
    }
    for fn, kw in configs.values():  # warm-up
        fn(model, tok, examples[0]["prompt"], args.max_new_tokens, **kw)
    outputs, totals = {}, {name: [] for name in configs}
    for rep in range(args.repeats):
        seconds = dict.fromkeys(configs, 0.0)
        for i, ex in enumerate(examples):
            for name, (fn, kw) in configs.items():
                ids, text, nfe, sec = fn(model, tok, ex["prompt"], args.max_new_tokens, **kw)
                seconds[name] += sec
                if rep == 0:
                    outputs.setdefault(name, []).append((ids, text, nfe))
        for name in configs:
            totals[name].append(seconds[name])
    greedy = [o[0] for o in outputs["HF greedy generate"]]
    base = statistics.median(totals["HF greedy generate"])
    lines = [
        "# SBD-verify against its peers",
        "",
        f"Command: `python benchmarks/verify_vs_peers.py --model {args.model} --n {args.n} --repeats {args.repeats}`",
        "",
        (f"{len(examples)} held-out problems ({args.n} per task: {args.tasks}), greedy, batch 1, max "
         f"{args.max_new_tokens} new tokens; time = median over {args.repeats} passes of the summed per-prompt "
         f"wall times, configurations interleaved prompt by prompt after one warm-up call each. Machine: "
         f"{platform.platform()}, {args.threads} torch threads, torch {torch.__version__}, fp32."),
        "",
        ("| decoding | accuracy % | same tokens as HF greedy | forwards / answer | tokens / forward | tokens/s "
         "| wall-clock vs HF greedy |"),
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in configs:
        outs = outputs[name]
        acc = sum(score(ex["task"], ex["entry"], o[1]) >= 1.0 for ex, o in zip(examples, outs)) / len(examples)
        same = sum(o[0] == g for o, g in zip(outs, greedy))
        tokens = sum(len(o[0]) for o in outs)
        nfe = sum(o[2] for o in outs) if outs[0][2] is not None else None
        med = statistics.median(totals[name])
        lines.append(f"| {name} | {100 * acc:.1f} | {same}/{len(examples)} | "
                     f"{'–' if nfe is None else f'{nfe / len(examples):.1f}'} | "
                     f"{'–' if nfe is None else f'{tokens / nfe:.2f}'} | {tokens / med:.0f} | {base / med:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
