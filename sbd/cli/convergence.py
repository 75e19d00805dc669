"""`sbd convergence`: has SBD fine-tuning converged? Masked vs next-token accuracy, teacher-forced.

A thin layer over `sbd.training.convergence`: loads the model and held-out data, prints the Markdown
report and, with --out, writes convergence.json and convergence.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import SBDError
from .args import positive_int

DEFAULT_TASKS = "chain_sum,number_sorting,word_sequence_reversal"


def add_convergence_parser(sub) -> None:
    p = sub.add_parser(
        "convergence", help="teacher-forced masked vs next-token accuracy: has SBD training converged?",
        description="Score a model's masked predictions without decoding: each held-out token is predicted "
                    "with the true tokens before it in its block and masks after it (the information NTP "
                    "has), and with its whole block masked, next to the model's NTP prediction of the same "
                    "token. Reports the gap in points (near 0: converged), by block position, for interior "
                    "blocks and the final block (the one holding EOS), and the entropy calibration.")
    p.add_argument("--model", required=True, help="model folder (or demo / demo-ntp, the shipped models)")
    p.add_argument("--task", default=DEFAULT_TASKS,
                   help=f"held-out problems of these tasks (default: {DEFAULT_TASKS})")
    p.add_argument("--data", default=None,
                   help="held-out data instead of --task: FILE.jsonl with {prompt, completion} or {text} records, "
                        "or reasoning-gym:NAME?size=N&seed=S")
    p.add_argument("--n", type=positive_int, default=50,
                   help="problems per task, or the first N records of --data (default: 50)")
    p.add_argument("--block-size", type=positive_int, default=16, help="block size to score (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out problems (default: 0)")
    p.add_argument("--max-len", type=positive_int, default=1024, help="longer sequences are truncated (default: 1024)")
    p.add_argument("--out", default=None, help="folder for convergence.json and convergence.md (optional)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_convergence(args) -> None:
    from .eval import parse_tasks

    tasks = None if args.data else parse_tasks(args.task)
    if args.data and not args.data.startswith("reasoning-gym:") and not Path(args.data).is_file():
        raise SBDError(f"data file {args.data!r} does not exist")

    import torch

    from ..training.convergence import convergence_check, heldout_examples
    from ..models.loading import load
    from ..training.data import load_records, tokenize_records

    model, tokenizer = load(args.model, dtype=torch.float32, weights="float")
    if getattr(model.config, "sbd_mask_token_id", None) is None:
        raise SBDError(f"{args.model!r} has no SBD mask token: it was not trained for SBD (sbd train adds one)")
    if tasks is not None:
        examples = heldout_examples(tokenizer, tasks, args.n, args.seed, args.max_len)
        source = f"{args.n} held-out problems per task of {', '.join(tasks)} (seed {args.seed})"
    else:
        dataset = tokenize_records(load_records(args.data)[: args.n], tokenizer, args.max_len)
        examples = [dataset[i] for i in range(len(dataset))]
        source = f"the first {len(examples)} records of {args.data}"
    report = convergence_check(model, examples, block_size=args.block_size, progress=not args.no_progress)
    text = f"Model: {args.model}. Data: {source}.\n\n" + report.to_markdown()
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "convergence.json").write_text(json.dumps({"model": args.model, "data": source, **report.to_dict()},
                                                         indent=1))
        (out / "convergence.md").write_text(text)
        print(f"written: {out / 'convergence.json'}, {out / 'convergence.md'}")
