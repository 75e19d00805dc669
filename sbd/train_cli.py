"""`sbd train`: fine-tune a model with the SBD recipe (or the NTP baseline) through SBDTrainer.

Runs unchanged under `torchrun` / `accelerate launch` for data-parallel training; only the main
process prints. User mistakes raise SBDError before any model is loaded where possible.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .errors import SBDError

RUN_FILE = "sbd_train.json"
METRICS_FILE = "metrics.jsonl"
# settings a resumed run must share with the run it continues (anything else would not be a resume)
RESUME_KEYS = ("data", "mode", "steps", "batch_size", "grad_accum", "lr", "warmup_steps", "max_len",
               "block_size_min", "block_size_max", "block_size", "mask_rate", "align_to_completion", "last_block",
               "suffix_share", "seed")


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="fine-tune a model for set block decoding (or the NTP baseline)",
                       description="Fine-tune a local Hugging Face causal LM with the SBD recipe: the doubled "
                                   "sequence [x | masked x], NTP + MATP loss, block size drawn per step. Writes "
                                   "checkpoints, metrics.jsonl and a final model folder that `sbd generate` uses.")
    p.add_argument("--model", required=True, help="local model folder (safetensors) to start from")
    p.add_argument("--data", required=True,
                   help="FILE.jsonl with {prompt, completion} or {text} records, or reasoning-gym:NAME?size=N&seed=S")
    p.add_argument("--out", required=True, help="output folder: checkpoints, metrics.jsonl and the final model")
    p.add_argument("--mode", default="sbd", choices=["sbd", "ntp"],
                   help="sbd: the SBD recipe; ntp: plain next-token loss on the same data (default: sbd)")
    p.add_argument("--steps", type=int, default=1000, help="optimisation steps (default: 1000)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per device per micro-batch (default: 8)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimisation step (default: 1)")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate of AdamW (default: 3e-4)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="linear warmup before the cosine decay (default: 200, or steps/10 if that is smaller)")
    p.add_argument("--max-len", type=int, default=1024, help="longer sequences are truncated (default: 1024)")
    p.add_argument("--block-size-min", type=int, default=2, help="smallest block size drawn (default: 2)")
    p.add_argument("--block-size-max", type=int, default=16, help="largest block size drawn (default: 16)")
    p.add_argument("--block-size", type=int, default=None, help="use this block size at every step instead")
    p.add_argument("--mask-rate", type=float, default=None, help="fixed masking rate instead of eta ~ U(0,1)")
    p.add_argument("--align-to-completion", action="store_true",
                   help="noisy copy holds only the completion, blocks start at its first token (prompt/completion data)")
    p.add_argument("--last-block", default="eos", choices=["eos", "drop"],
                   help="eos: pad the block that holds a sequence's final EOS with EOS targets, so the block "
                        "decoding stops in is trained for every block size (default); drop: the paper's rule, "
                        "masked targets only inside complete blocks")
    p.add_argument("--suffix-share", type=float, default=0.0,
                   help="share of blocks masked as a suffix (first tokens visible, the rest masked) instead of "
                        "independently at rate eta (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation-free randomness: data order, masks, k")
    p.add_argument("--save-steps", type=int, default=500, help="checkpoint every N steps, and at the end (default: 500)")
    p.add_argument("--save-total-limit", type=int, default=2, help="checkpoints kept (default: 2; 0 keeps all)")
    p.add_argument("--logging-steps", type=int, default=10, help="log every N steps (default: 10)")
    p.add_argument("--attention", default="auto", choices=["auto", "sdpa", "flex"],
                   help="auto: flex_attention on CUDA, SDPA with a dense mask elsewhere (default: auto)")
    p.add_argument("--eval-data", default=None,
                   help="held-out data (same forms as --data): every --eval-steps, log the teacher-forced masked vs "
                        "NTP accuracy on it (see `sbd convergence`)")
    p.add_argument("--eval-n", type=int, default=64, help="records of --eval-data used (default: 64)")
    p.add_argument("--eval-steps", type=int, default=None, help="steps between checks (default: --save-steps)")
    p.add_argument("--eval-block-size", type=int, default=16, help="block size of the check (default: 16)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _check(args) -> None:
    ints = {"--steps": args.steps, "--batch-size": args.batch_size, "--grad-accum": args.grad_accum,
            "--save-steps": args.save_steps, "--logging-steps": args.logging_steps}
    for flag, value in ints.items():
        if value < 1:
            raise SBDError(f"{flag} must be >= 1, got {value}")
    if not math.isfinite(args.lr) or args.lr <= 0:
        raise SBDError(f"--lr must be a positive number, got {args.lr}")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise SBDError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.max_len < 2:
        raise SBDError(f"--max-len must be >= 2, got {args.max_len}")
    if not 1 <= args.block_size_min <= args.block_size_max:
        raise SBDError(f"need 1 <= --block-size-min <= --block-size-max, got {args.block_size_min} and "
                       f"{args.block_size_max}")
    if args.block_size is not None and args.block_size < 1:
        raise SBDError(f"--block-size must be >= 1, got {args.block_size}")
    if args.mask_rate is not None and not (0 < args.mask_rate <= 1):
        raise SBDError(f"--mask-rate must lie in (0, 1], got {args.mask_rate}")
    for flag, value in (("--eval-n", args.eval_n), ("--eval-block-size", args.eval_block_size),
                        ("--eval-steps", args.eval_steps if args.eval_steps is not None else 1)):
        if value < 1:
            raise SBDError(f"{flag} must be >= 1, got {value}")
    if not 0 <= args.suffix_share <= 1:
        raise SBDError(f"--suffix-share must lie in [0, 1], got {args.suffix_share}")
    if args.save_total_limit < 0:
        raise SBDError(f"--save-total-limit must be >= 0, got {args.save_total_limit}")


def _run_settings(args) -> dict:
    return {k: getattr(args, k) for k in RESUME_KEYS}


def _prepare_out(args) -> str | None:
    """Checks --out against --resume; returns the checkpoint to resume from."""
    from .training.checkpoints import latest_checkpoint

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SBDError(f"--out {args.out!r} exists and is not a folder")
    latest = latest_checkpoint(out)
    if not args.resume:
        if latest is not None:
            raise SBDError(f"{args.out!r} already holds checkpoints; pass --resume to continue or choose another --out")
        return None
    if latest is None:
        raise SBDError(f"--resume: no checkpoint in {args.out!r}")
    saved = out / RUN_FILE
    if saved.is_file():
        before = json.loads(saved.read_text())
        now = _run_settings(args)
        changed = [k for k in RESUME_KEYS if k in before and before[k] != now[k]]
        if changed:
            k = changed[0]
            raise SBDError(f"--resume with a different --{k.replace('_', '-')} ({now[k]!r}, the run used "
                           f"{before[k]!r}); resume with the same settings or use another --out")
    return str(latest)


def _is_main_process() -> bool:
    """Rank 0 of a torchrun / accelerate launch, or a plain single-process run."""
    import os

    return os.environ.get("RANK", "0") == "0"


def cmd_train(args) -> None:
    _check(args)
    for flag, spec in (("--data", args.data), ("--eval-data", args.eval_data)):
        if spec is not None and not spec.startswith("reasoning-gym:") and not Path(spec).is_file():
            raise SBDError(f"{flag} file {spec!r} does not exist")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise SBDError(f"--out {args.out!r} exists and is not a folder")
    if not _is_main_process():
        return _train(args)
    from .training.run_lock import run_lock

    with run_lock(args.out):  # a second run on the same --out is refused; a crash releases the lock
        _train(args)


def _train(args) -> None:
    resume_from = _prepare_out(args)

    import torch

    from .loading import add_mask_token, load
    from .training.collator import SBDDataCollator
    from .training.data import load_records, tokenize_records
    from .training.trainer import SBDTrainer, sbd_training_args

    records = load_records(args.data)
    cuda = torch.cuda.is_available()
    model, tokenizer = load(args.model, device="cuda" if cuda else "cpu", dtype=torch.float32)
    if cuda and args.attention in ("auto", "flex"):
        try:
            model.set_attn_implementation("flex_attention")
        except Exception as e:  # an architecture without flex support keeps SDPA
            if args.attention == "flex":
                raise SBDError(f"this model cannot use flex_attention: {str(e).splitlines()[0]}") from None
    mask_id = add_mask_token(model, tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dataset = tokenize_records(records, tokenizer, args.max_len, mask_id)
    heldout = None
    if args.eval_data is not None:
        held = tokenize_records(load_records(args.eval_data)[: args.eval_n], tokenizer, args.max_len, mask_id)
        heldout = [held[i] for i in range(len(held))]
    collator = SBDDataCollator(tokenizer, mask_token_id=mask_id, block_size=args.block_size,
                               mask_rate=args.mask_rate, block_size_range=(args.block_size_min, args.block_size_max),
                               align_to_completion=args.align_to_completion, last_block=args.last_block,
                               suffix_share=args.suffix_share)
    warmup = args.warmup_steps if args.warmup_steps is not None else min(200, args.steps // 10)
    training_args = sbd_training_args(
        args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=warmup,
        grad_accum=args.grad_accum, seed=args.seed, save_steps=args.save_steps,
        save_total_limit=args.save_total_limit or None, logging_steps=args.logging_steps)
    out = Path(args.out)
    trainer = SBDTrainer(model, training_args, data_collator=collator, train_dataset=dataset,
                         processing_class=tokenizer, mode=args.mode, metrics_file=out / METRICS_FILE,
                         show_progress=not args.no_progress, convergence_examples=heldout,
                         convergence_steps=args.eval_steps, convergence_block_size=args.eval_block_size)
    main = trainer.is_world_process_zero()
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / RUN_FILE).write_text(json.dumps({**_run_settings(args), "model": str(args.model)}, indent=1))
    trainer.train(resume_from_checkpoint=resume_from)
    step = trainer.state.global_step
    if trainer.interrupted:
        if main:
            print(f"stopped at step {step}: checkpoint saved in {out / f'checkpoint-{step}'}; "
                  "continue with the same command and --resume")
        raise KeyboardInterrupt
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    trainer.save_model(str(out))  # weights (safetensors), config with sbd_mask_token_id, tokenizer
    if main:
        print(f"trained {step} steps ({args.mode}); model saved to {out} — "
              f"try: sbd generate --model {out} \"...\"")
