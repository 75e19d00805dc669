"""One learning-curve point of the self-distillation campaign per adapter: held-out tokens per forward
of greedy sbd-verify with the masks alone (whole blocks, no lookup, a chain) and with the best
configuration (`--best`), on held-out gsm_symbolic and on the mixed set, and whether every answer is
the original model's Hugging Face greedy answer (answers that part from it at a near tie, where float
rounding decides, are counted apart: sbd/benchmarking/ties.py). Forward counts only (timing: tree_drafts.py).

    python benchmarks/smollm2/campaign/curve_point.py smollm2 runs/campaign/ab/cheap \
        --sets runs/campaign/eval/heldout_gsm.jsonl,runs/campaign/eval/heldout_other.jsonl --n 10 \
        --append benchmarks/smollm2/campaign/results/curve.json

An adapter is `smollm2` (the shipped one) or an adapter folder (`sbd train --adapter lora --out`); its
sequences seen are read from the run's trainer state when there is one.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch


def sequences_seen(folder: Path) -> int | None:
    """Training sequences behind an adapter folder: its run's steps × batch × accumulation, plus what the
    adapter it continued had seen (the `start_sequences` recorded next to the run, if any)."""
    state = folder / "trainer_state.json"
    if not state.is_file():
        ck = sorted(folder.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
        state = ck[-1] if ck else None
    home = folder if (folder / "sbd_train.json").is_file() else folder.parent  # a run, or one of its checkpoints
    run = home / "sbd_train.json"
    if state is None or not run.is_file():
        return None
    st, cfg = json.loads(state.read_text()), json.loads(run.read_text())
    start = json.loads((home / "start.json").read_text())["sequences_seen"] if (home / "start.json").is_file() else 0
    return start + int(st["global_step"]) * int(cfg["batch_size"]) * int(cfg.get("grad_accum", 1))


def machine() -> str:
    """The machine and library versions a point was measured with (points are compared across sessions)."""
    import transformers

    return f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, transformers {transformers.__version__}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("adapters", nargs="+", help="smollm2 (shipped) or adapter folders")
    ap.add_argument("--sets", default="runs/campaign/eval/heldout_gsm.jsonl,runs/campaign/eval/heldout_other.jsonl")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--best", default="tree=3,2+lookup", help="the configuration reported as 'best' (tree_drafts.py syntax)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--append", default=None, help="a JSON list file the points are appended to")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import sbd
    from sbd.drafters import adapter as adapters
    from sbd.drafters import sampler_head as heads
    from sbd.benchmarking.ties import near_ties
    from sbd.decoding.generate import encode_prompts
    from sbd.models.narrow_linear import linear_layers
    from sbd.tasks.prompts import load_prompts

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tree_drafts import parse  # the configuration syntax, in one place

    model, tok = sbd.load("smollm2", sampler_head=False)  # the shipped head is loaded below, with its adapter
    shipped_folder = Path(sbd.__file__).parent / "adapters/smollm2"
    sets = {Path(s).stem.replace("heldout_", ""): encode_prompts(tok, load_prompts(s)[: args.n], chat=True)
            for s in args.sets.split(",")}
    refs = {}
    adapters.detach(model)
    for name, ids in sets.items():  # the original model's HF greedy answers
        refs[name] = []
        for p in ids:
            x = torch.tensor([p])
            with torch.no_grad(), linear_layers(model, False):  # stock transformers
                out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                     do_sample=False, pad_token_id=tok.eos_token_id)
            refs[name].append(out[0, len(p):].tolist())
    points = []
    for spec in args.adapters:
        if spec == "smollm2":
            folder, seen = shipped_folder, json.loads((shipped_folder / "training_record.json").read_text())["sequences_seen"]
        else:
            folder = Path(spec)
            seen = sequences_seen(folder)
        adapters.load(model, folder)
        if heads.has_head(folder):  # its sampler head drafts with the masks
            heads.load(model, folder)
        point = {"adapter": spec, "sampler_head": heads.head_of(model) is not None, "sequences_seen": seen, "block_size": args.block_size, "n": args.n,
                 "sets": args.sets,
                 "max_new_tokens": args.max_new_tokens, "best": args.best, "date": time.strftime("%Y-%m-%d"),
                 "machine": machine()}
        for name, ids in sets.items():
            for label, config in (("masks", "chain"), ("best", args.best)):
                kw = parse(config, args.block_size)
                kw.pop("reuse_leftover", None)
                nfe = tokens = same = 0
                answers = []
                for p, ref in zip(ids, refs[name]):
                    r = sbd.generate(model, tok, [p], max_new_tokens=args.max_new_tokens, **kw)
                    nfe += r.nfe[0]
                    tokens += len(r.token_ids[0])
                    same += r.token_ids[0] == ref
                    answers.append(r.token_ids[0])
                point[f"{name}_{label}_tpf"] = round(tokens / max(1, nfe), 3)
                point[f"{name}_{label}_identical"] = f"{same}/{len(ids)}"
                point[f"{name}_{label}_near_ties"] = near_ties(model, ids, answers, refs[name])  # ties.py
        print(json.dumps(point), flush=True)
        points.append(point)
        adapters.detach(model)
        heads.detach(model)
    if args.append:
        path = Path(args.append)
        old = json.loads(path.read_text()) if path.is_file() else []
        path.write_text(json.dumps(old + points, indent=1) + "\n")


if __name__ == "__main__":
    main()
