"""`sbd eval`: accuracy, forward passes and wall-clock time of NTP and SBD decoding on any model that
`sbd.load` accepts, written as JSON, a Table-1-style Markdown table and an accuracy-vs-speedup plot. Arguments are checked before the model
is loaded; mistakes raise SBDError (one line in the CLI)."""

from __future__ import annotations

import argparse
import math
import shlex
import time
from pathlib import Path

from ..errors import SBDError
from .args import add_weights_option, weights_arg
from .args import positive_int as _positive

NO_GAMMA = ("none", "")  # --gamma none: NTP decoding only (a model without a mask token)


def parse_gammas(text: str) -> list[float]:
    """`0,0.1,0.35,inf` -> [0.0, 0.1, 0.35, inf]; `none` -> [] (NTP only). SBDError if it does not parse."""
    if text.strip().lower() in NO_GAMMA:
        return []
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise SBDError(f"γ list {text!r} does not parse: {part!r} is not a number "
                           f"(write e.g. 0,0.1,0.35,inf, or none for NTP only)") from None
        if math.isnan(value) or value < 0:
            raise SBDError(f"γ list {text!r}: every γ must be >= 0 (inf allowed), got {part!r}")
        values.append(value)
    return values


def parse_tasks(text: str) -> list[str]:
    """`chain_sum,number_sorting` -> the names, each checked against the task registry."""
    from ..tasks import get_task

    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise SBDError("--task needs at least one task name")
    for name in names:
        get_task(name)
    return names


def _argtype(parse):
    """Wrap a parser that raises SBDError into an argparse type (argparse then prints usage + the reason)."""
    def convert(text: str):
        try:
            return parse(text)
        except SBDError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = parse.__name__
    return convert


def add_eval_parser(sub) -> argparse.ArgumentParser:
    """Register `eval` on a subparsers object; returns its parser."""
    from ..evaluation.harness import DEFAULT_MAX_NEW_TOKENS
    from ..tasks import TASKS

    p = sub.add_parser("eval", help="accuracy, NFE and speed of NTP vs SBD decoding on held-out task problems",
                       description="Decode seeded held-out problems of reasoning-gym tasks with NTP and with SBD at "
                                   "each γ, score the answers with reasoning-gym, and write results.json, results.md "
                                   "(a table laid out like the paper's Table 1) and accuracy_vs_speedup.png to --out. "
                                   "Speedups are against NTP decoding of the same model in the same process.")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="local model folder (safetensors), or a shipped model: demo, smollm2 (with its drafter)")
    p.add_argument("--adapter", default=None, metavar="DIR",
                   help="a drafting adapter folder (sbd train --adapter lora, or one of its checkpoints) to decode "
                        "with instead of the model's own (default: the model's own or the shipped one)")
    p.add_argument("--chat", action="store_true",
                   help="ask each bare question through the tokenizer's chat template (for instruction-tuned "
                        "models, which answer in their own words) and read the final answer as the reply's "
                        "'Answer:' line or else its last number; default: the task's worked-solution prompt")
    p.add_argument("--task", required=True, type=_argtype(parse_tasks), metavar="NAME[,NAME]",
                   help=f"task name or comma-separated names; known: {', '.join(TASKS)}")
    p.add_argument("--n", type=_positive, default=200, help="held-out problems per task (default: 200)")
    p.add_argument("--gamma", type=_argtype(parse_gammas), default=[0.0, 0.1, 0.35, 0.6, 1.0], metavar="LIST",
                   help="comma-separated EB-sampler bounds for SBD, e.g. 0,0.1,0.35,inf; none = NTP only "
                        "(default: 0,0.1,0.35,0.6,1)")
    p.add_argument("--block-size", type=_positive, default=16, metavar="K", help="SBD block size (default: 16)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder for results.json, results.md and the plot (created)")
    p.add_argument("--batch-size", type=_positive, default=1,
                   help="prompts decoded together, each row independently (default: 1)")
    p.add_argument("--max-new-tokens", type=_positive, default=DEFAULT_MAX_NEW_TOKENS,
                   help="generation budget per answer, the same for every decoding "
                        f"(default: {DEFAULT_MAX_NEW_TOKENS})")
    p.add_argument("--repeats", type=_positive, default=1,
                   help="timed runs per decoding; times are the median (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out problems (default: 0)")
    p.add_argument("--anchor", action="store_true",
                   help="decode the γ configs with plain SBD anchored on the model's own next token (each forward "
                        "takes the next-token head's token, then the masks' tokens after it left to right under "
                        "the bound γ; for drafters trained for sbd-verify's all-mask blocks)")
    p.add_argument("--verify", action="store_true",
                   help="also decode with SBD whose drafts are verified by the model's own next-token head "
                        "(method sbd-verify, same --block-size): NTP's answers in fewer forwards")
    p.add_argument("--no-ntp", action="store_true",
                   help="skip NTP decoding (faster, but then no speedups can be computed)")
    p.add_argument("--label", default=None, help="model name in the table and plot (default: the folder name)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_weights_option(p)
    p.add_argument("--threads", type=_positive, default=None,
                   help="torch CPU threads (default: torch's choice); recorded in results.json")
    p.add_argument("--save-outputs", action="store_true", help="also store every generated answer in results.json")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def command_line(args) -> str:
    """The `sbd eval` command that reproduces this run (all settings explicit)."""
    gammas = ",".join("inf" if math.isinf(g) else f"{g:g}" for g in args.gamma) or "none"
    parts = ["sbd", "eval", "--model", str(args.model), "--task", ",".join(args.task), "--n", str(args.n),
             "--gamma", gammas, "--block-size", str(args.block_size), "--out", str(args.out),
             "--batch-size", str(args.batch_size), "--max-new-tokens", str(args.max_new_tokens),
             "--repeats", str(args.repeats), "--seed", str(args.seed)]
    if args.adapter:
        parts[4:4] = ["--adapter", str(args.adapter)]
    if args.chat:
        parts.append("--chat")
    if args.anchor:
        parts.append("--anchor")
    if args.verify:
        parts.append("--verify")
    if args.no_ntp:
        parts.append("--no-ntp")
    if args.label:
        parts += ["--label", args.label]
    if args.threads:
        parts += ["--threads", str(args.threads)]
    return shlex.join(parts)


def cmd_eval(args) -> dict:
    """Run the evaluation, write the report, print the summary table; returns the written paths."""
    from ..evaluation import evaluate, write_report
    from ..evaluation.report import model_metadata
    from ..evaluation.table import summary_table
    from ..models.loading import load

    if args.no_ntp and not args.gamma and not args.verify:
        raise SBDError("nothing to evaluate: --no-ntp with no γ (give --gamma values, --verify, or drop --no-ntp)")
    label = args.label or Path(str(args.model)).name or str(args.model)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, adapter=args.adapter, device=args.device, weights=weights_arg(args))
    start = time.perf_counter()
    rows = evaluate(model, tokenizer, args.task, args.n, args.gamma, block_size=args.block_size,
                    include_ntp=not args.no_ntp, include_verify=args.verify, max_new_tokens=args.max_new_tokens,
                    batch_size=args.batch_size,
                    repeats=args.repeats, seed=args.seed, label=label, progress=not args.no_progress,
                    keep_outputs=args.save_outputs, chat=args.chat, anchor=args.anchor)
    meta = {"label": label, "model": str(args.model), "adapter": args.adapter and str(args.adapter),
            "chat": args.chat, "command": command_line(args), **model_metadata(model),
            "eval_seconds": round(time.perf_counter() - start, 3)}
    paths = write_report(rows, args.out, meta)
    print(summary_table(rows))
    print()
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return paths
