"""`sbd bench`: every way of decoding one model, timed in one process, interleaved; writes bench.json,
bench.md and bench.png. Arguments are checked before the model is loaded."""

from __future__ import annotations

import shlex
import sys

from ..errors import SBDError
from .args import positive_list as parse_sizes
from .args import positive_int as _positive
from .eval import _argtype, parse_gammas, parse_tasks
from .model_options import add_model_options, model_from_args

DEFAULT_TASKS = "chain_sum,number_sorting,word_sequence_reversal"


def add_bench_parser(sub):
    p = sub.add_parser(
        "bench", help="wall-clock of HF generate, prompt-lookup, assisted, NTP, SBD and SBD-verify on one model",
        description="Time every way of decoding one model on the same prompts in one process: Hugging Face greedy "
                    "generate, prompt-lookup decoding, assisted decoding (with --assistant), our NTP loop, SBD at each "
                    "γ and SBD-verify. An untimed pass records outputs and forward shapes (and warms up); then the "
                    "methods take turns batch by batch for --repeats timed passes; medians are reported. For our "
                    "loops the eq.-16 limit (the summed time of their forwards, each timed alone) is given with the "
                    "share of it reached. Writes bench.json, bench.md and bench.png to --out.")
    add_model_options(p, narrow_choices=("auto", "on", "off", "both"), narrow_help=(
        "linear layers of few-token forwards as W·xᵀ (on), as torch's F.linear (off), or a row of each for every "
        "method but our NTP loop (both: the A/B in one process; the NTP loop runs as loaded); auto: our rows as "
        "sbd.load sets it (on for float32 on an AMD CPU), Hugging Face's rows on torch's own layers (stock transformers)"),
        shape_help="a random-weight Llama with these shapes, fed --n random prompts of --prompt-tokens tokens "
                   "(timing only: use --methods hf,ntp,sbd-fixed)")
    p.add_argument("--task", type=_argtype(parse_tasks), default=None, metavar="NAME[,NAME]",
                   help=f"held-out task problems as prompts, scored for accuracy (default: {DEFAULT_TASKS} "
                        "unless --prompts is given)")
    p.add_argument("--n", type=_positive, default=None,
                   help="problems per task, random prompts with --shape (default: 10), or the first N of --prompts "
                        "(default: all of them)")
    p.add_argument("--prompts", metavar="SOURCE", default=None,
                   help="prompts instead of task problems (no accuracy column): FILE.txt (one per line, \\n for a line "
                        "break), FILE.jsonl ({prompt} or {messages} per line), task:NAME?split=test&n=N or "
                        "reasoning-gym:NAME?size=N&seed=S")
    p.add_argument("--prompt-tokens", type=_positive, default=64,
                   help="with --shape: tokens per random prompt (default: 64)")
    p.add_argument("--methods", default="hf,prompt-lookup,ntp,sbd,sbd-verify", metavar="LIST",
                   help="comma-separated: hf, prompt-lookup, assisted, ntp, sbd (one row per --gamma), sbd-verify, "
                        "sbd-verify-adaptive (draft length chosen per row, at most the block size), "
                        "sbd-verify-lookup and sbd-verify-adaptive-lookup (the same, drafting from prompt lookup "
                        "when the last 3 or 2 tokens occurred before, else from the masks), "
                        "sbd-verify-defaults (the drafting settings sbd-verify uses when none are given: the "
                        "model's measured defaults), "
                        "sbd-fixed (one row per --fixed: a fixed number of tokens revealed per forward, for timing); "
                        "NAME@narrow or NAME@flinear: that method's row on sbd's narrow linear layers or on torch's "
                        "own, whatever --narrow-linear says (e.g. prompt-lookup@narrow beside prompt-lookup); "
                        "our NTP loop is always added (default: hf,prompt-lookup,ntp,sbd,sbd-verify)")
    p.add_argument("--fixed", type=_argtype(parse_sizes), default=[2, 3, 4], metavar="LIST",
                   help="tokens revealed per forward by the sbd-fixed rows (default: 2,3,4)")
    p.add_argument("--gamma", type=_argtype(parse_gammas), default=[0.35], metavar="LIST",
                   help="EB-sampler bounds of the SBD rows, e.g. 0,0.35,inf (default: 0.35)")
    p.add_argument("--block-size", type=_argtype(parse_sizes), default=[16], metavar="LIST",
                   help="SBD block sizes, e.g. 8,16: one SBD row per (block size, γ), one SBD-verify row per "
                        "block size (default: 16)")
    p.add_argument("--batch-size", type=_argtype(parse_sizes), default=[1], metavar="LIST",
                   help="batch sizes, e.g. 1,4; prompt-lookup and assisted run at batch 1 only (default: 1)")
    p.add_argument("--assistant", metavar="PATH", default=None,
                   help="small model with the same tokenizer: adds Hugging Face assisted decoding")
    p.add_argument("--compile", action="store_true",
                   help="also run each of our rows through torch.compile on static shapes (CUDA: CUDA graphs); "
                        "the first calls compile (seconds to minutes), the timed passes reuse it")
    p.add_argument("--chat", action="store_true",
                   help="put each prompt through the tokenizer's chat template as a user message (instruct models)")
    p.add_argument("--repeats", type=_positive, default=3, help="timed passes; the median is reported (default: 3)")
    p.add_argument("--max-new-tokens", type=_positive, default=112, help="generation budget (default: 112)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out problems (default: 0)")
    p.add_argument("--threads", type=_positive, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for bench.json, bench.md, bench.png (created)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _prompts(args) -> tuple[list, list[dict] | None]:
    if args.prompts:
        from ..tasks.prompts import load_prompts

        prompts = load_prompts(args.prompts)
        return (prompts if args.n is None else prompts[:args.n]), None
    from ..tasks import make_split

    examples = [ex for t in (args.task or parse_tasks(DEFAULT_TASKS)) for ex in make_split(t, "test", args.n or 10, args.seed)]
    return [ex["prompt"] for ex in examples], examples


def cmd_bench(args) -> dict:
    from ..benchmarking import bench, parse_methods
    from ..benchmarking.report import bench_markdown, write_bench
    from ..models import extension
    from ..models.loading import load

    import torch

    if args.task and args.prompts:
        raise SBDError("give --task or --prompts, not both")
    if args.shape and (args.task or args.prompts or args.assistant or args.chat):
        raise SBDError("--shape feeds random prompts to a random model: no --task, --prompts, --assistant or --chat")
    narrow = {"auto": [None], "on": [True], "off": [False], "both": [False, True]}[args.narrow_linear]
    methods = parse_methods(args.methods, args.gamma, args.block_size, args.assistant is not None, args.compile,
                            args.fixed, narrow)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.shape:
        prompts, examples = _prompts(args)  # before loading: a bad prompt file fails at once
    extension.prepare(args.device)  # compiled before anything is timed (once per machine)
    model, tokenizer = model_from_args(args)
    if args.shape:
        g = torch.Generator().manual_seed(args.seed)
        vocab = model.config.vocab_size
        prompts, examples = [torch.randint(3, vocab - 1, (args.prompt_tokens,), generator=g).tolist()
                             for _ in range(args.n or 10)], None
    assistant = load(args.assistant, device=args.device)[0] if args.assistant else None
    result = bench(model, tokenizer, prompts, methods, batch_sizes=args.batch_size, repeats=args.repeats,
                   max_new_tokens=args.max_new_tokens, examples=examples, assistant=assistant,
                   progress=not args.no_progress, chat=args.chat)
    command = shlex.join(["sbd", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else None
    paths = write_bench(result, args.out, command)
    print(bench_markdown(result))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return paths
