"""Recipe study: which training lever closes the gap between masked (SBD) and next-token prediction.

Every arm fine-tunes the same start model (default: the shipped NTP-trained demo model) on the same
seeded task data, in the same order, for the same number of steps; the NTP arm is the fair baseline.
Each arm is then scored by `sbd.training.convergence` on held-out problems (teacher-forced masked vs
NTP top-1 accuracy). Arms already trained are skipped, so an interrupted study continues.

    python benchmarks/recipe_study.py --out runs/study --steps 300 [--arms ntp,eos,drop,...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

ARMS = {
    "ntp": ["--mode", "ntp"],
    "drop": ["--last-block", "drop"],                      # the paper's rule: complete blocks only
    "eos": [],                                             # EOS padding (the default)
    "eos+suffix50": ["--suffix-share", "0.5"],
    "eos+lr1e-3": ["--lr", "1e-3"],
    "eos+k8-16": ["--block-size-min", "8"],
    "eos-900steps": ["--steps", "900"],                    # training length (argparse keeps the last --steps)
    "ntp-900steps": ["--mode", "ntp", "--steps", "900"],   # its fair NTP baseline
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="study folder (data, one folder per arm, study.json)")
    ap.add_argument("--start", default="demo-ntp", help="start model: a folder, or demo-ntp (default)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms of {', '.join(ARMS)}")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=24)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--train-per-task", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check-per-task", type=int, default=50, help="held-out problems per task for the check")
    args = ap.parse_args()

    import torch

    from sbd.cli.args import config_from_args
    from sbd.cli.main import build_parser
    from sbd.models.names import DEMO_NAMES, demo_path
    from sbd.tasks import render_jsonl
    from sbd.training.checkpoints import latest_checkpoint
    from sbd.training.run import TrainConfig, train

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "train.jsonl"
    if not data.exists():
        render_jsonl(["chain_sum", "number_sorting", "word_sequence_reversal"], "train", args.train_per_task, 0, data)
    start = out / "start"  # a copy, so the study keeps its start when the shipped demo model changes
    if not start.exists():
        shutil.copytree(demo_path(args.start) if args.start in DEMO_NAMES else Path(args.start), start)
    record_path = out / "study.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    for arm in args.arms.split(","):
        dest = out / arm
        if (dest / "model.safetensors").exists():
            print(f"{arm}: trained already")
            continue
        argv = ["train", "--model", str(start), "--data", str(data), "--out", str(dest), "--steps", str(args.steps),
                "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--max-len", "160",
                "--align-to-completion", "--save-steps", str(max(1, args.steps // 3)), "--logging-steps", "25",
                *ARMS[arm]]
        if latest_checkpoint(dest) is not None:
            argv.append("--resume")
        t0 = time.perf_counter()
        train(config_from_args(TrainConfig, build_parser().parse_args(argv)))
        record[arm] = {"argv": argv[1:], "seconds": round(time.perf_counter() - t0, 1)}
        record_path.write_text(json.dumps(record, indent=1))
        for ckpt in dest.glob("checkpoint-*"):
            shutil.rmtree(ckpt)
    check(out, record, args.arms.split(","), args.check_per_task)
    record_path.write_text(json.dumps(record, indent=1))


def check(out: Path, record: dict, arms: list[str], per_task: int) -> None:
    """The convergence check of every trained arm (and the start model), then one Markdown table."""
    import torch

    from sbd.training.convergence import convergence_check, heldout_examples
    from sbd.models.loading import load

    tasks = ["chain_sum", "number_sorting", "word_sequence_reversal"]
    for arm in ["start", *arms]:
        entry = record.setdefault(arm, {})
        if "check" in entry or not (out / arm / "model.safetensors").exists():
            continue
        model, tok = load(out / arm, dtype=torch.float32)
        report = convergence_check(model, heldout_examples(tok, tasks, per_task, 0, 160), block_size=16)
        entry["check"] = report.headline()
    print("| arm | NTP % | masked, left context % | gap | interior gap | final-block gap | fully masked % |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for arm in ["start", *arms]:
        h = record.get(arm, {}).get("check")
        if h:
            print(f"| {arm} | {h['ntp_acc']:.1f} | {h['masked_acc']:.1f} | {h['gap']:+.1f} | "
                  f"{h['interior_masked_acc'] - h['interior_ntp_acc']:+.1f} | "
                  f"{h['final_masked_acc'] - h['final_ntp_acc']:+.1f} | {h['full_mask_acc']:.1f} |")


if __name__ == "__main__":
    main()
