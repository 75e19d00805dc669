"""Held-out tokens per forward of sbd-verify for every checkpoint of one or more training runs, against
sequences seen: the learning curve of the drafts. Greedy, batch 1, through the chat template. Every
output is checked against the ORIGINAL model's greedy tokens: an adapter run keeps them by design, a
full-weight fine-tune reproduces its own next-token head, which training may have moved.

    python benchmarks/smollm2/learning_curve.py RUN [RUN ...] --prompts PROMPTS.jsonl [--n 6]
        [--block-size 8] [--upto STEP] [--reference BASE_DIR] [--out FILE.md]

A run is an `sbd train --out` folder: adapter checkpoints (adapter_config.json) or full-weight ones.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch


def checkpoints(run: Path, upto: int | None) -> list[Path]:
    """The run's checkpoint folders in step order, up to `upto` steps."""
    points = sorted(run.glob("checkpoint-*"), key=lambda p: int(re.sub(r"\D", "", p.name)))
    return [p for p in points if upto is None or int(p.name.split("-")[1]) <= upto]


def start_model(run: Path) -> Path:
    """The model a run started from, as its sbd_train.json names it (relative to the run's parent);
    for a run that continued an adapter, the model under that adapter."""
    from sbd.drafters import adapter as adapters

    path = Path(json.loads((run / "sbd_train.json").read_text())["model"])
    path = path if path.is_absolute() else (run.parent / path)
    if (path / "adapter_config.json").exists():
        base = Path(adapters.read_config(path).base_model_name_or_path)
        path = base if base.is_absolute() else (path.parent / base)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="training run folders (their checkpoint-N folders are measured)")
    ap.add_argument("--prompts", required=True, help="held-out prompts (jsonl with a 'prompt' field)")
    ap.add_argument("--n", type=int, default=6, help="how many of the prompts")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--upto", type=int, default=None, help="only checkpoints up to this step")
    ap.add_argument("--reference", default=None,
                    help="the original model's folder (default: the first run's starting model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the table here (markdown)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import sbd
    from sbd.drafters import adapter as adapters
    from sbd.decoding.generate import encode_prompts
    from sbd.tasks.prompts import load_prompts

    runs = [Path(r) for r in args.runs]
    reference = Path(args.reference) if args.reference else start_model(runs[0])
    base, tok = sbd.load(str(reference), weights="float")
    ids = encode_prompts(tok, load_prompts(args.prompts)[: args.n], chat=True)
    ref = [sbd.generate(base, tok, [p], method="ntp", max_new_tokens=args.max_new_tokens).token_ids[0] for p in ids]

    def measure(model) -> tuple[float, int]:
        tokens = nfe = same = 0
        for p, r in zip(ids, ref):
            out = sbd.generate(model, tok, [p], method="sbd-verify", block_size=args.block_size,
                               draft="block", lookup=False, tree="chain", max_new_tokens=args.max_new_tokens)
            tokens, nfe, same = tokens + out.num_tokens, nfe + out.nfe[0], same + (out.token_ids[0] == r)
        return tokens / nfe, same

    rows = []
    for run in runs:
        settings = json.loads((run / "sbd_train.json").read_text())
        per_step = settings["batch_size"] * settings.get("grad_accum", 1)
        kind = "adapter" + (f" + KL {settings['kl_weight']:g}" if settings.get("kl_weight") else ", no KL") \
            if settings.get("adapter") else f"full fine-tune ({settings['mode']})"
        for ck in checkpoints(run, args.upto):
            if (ck / "adapter_config.json").exists():
                adapters.load(base, ck)
                tpf, same = measure(base)
                adapters.detach(base)
            else:
                model, _ = sbd.load(str(ck), weights="float")
                tpf, same = measure(model)
                del model
            step = int(ck.name.split("-")[1])
            rows.append((run.name, kind, step, step * per_step, tpf, same))
            print(f"{run.name} step {step}: {step * per_step} sequences seen, {tpf:.2f} tokens per forward, "
                  f"{same}/{len(ids)} identical to the original model", flush=True)
    lines = [f"sbd-verify learning curve: {len(ids)} held-out prompts from {Path(args.prompts).name}, block "
             f"{args.block_size}, greedy, batch 1, at most {args.max_new_tokens} new tokens; tokens compared with "
             f"the original model ({reference.name}) decoding greedily.", "",
             "| run | training | step | sequences seen | tokens per forward | identical to the original model |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r} | {k} | {s} | {q} | {t:.2f} | {m}/{len(ids)} |" for r, k, s, q, t, m in rows]
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
