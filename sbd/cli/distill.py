"""`sbd distill`: the model's own completions of a prompt set, as training data for its drafts."""

from __future__ import annotations

from .args import positive_int as _positive


def add_distill_parser(sub) -> None:
    p = sub.add_parser("distill", help="write the model's own completions of prompts as training data",
                       description="Decode every prompt with the model itself (greedy unless --temperature) and "
                                   "append {prompt, completion, prompt_ids, completion_ids} records to --out: the "
                                   "data a drafting adapter learns from, since sbd-verify accepts exactly what the "
                                   "model would say. Resumable: the same command skips prompts already in --out.")
    p.add_argument("--model", required=True, help="model folder (or demo, smollm2)")
    p.add_argument("--prompts", required=True, action="append", metavar="SOURCE",
                   help="FILE.jsonl ({prompt} or {messages} per line), FILE.txt (a prompt per line), "
                        "task:NAME?split=train&n=N&seed=S (a registry task's questions) or "
                        "reasoning-gym:NAME?size=N&seed=S; repeat to combine sources")
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="records are appended here")
    p.add_argument("--no-chat", action="store_true",
                   help="feed prompts as raw text (default: through the tokenizer's chat template)")
    p.add_argument("--max-new-tokens", type=_positive, default=256, help="completion budget (default: 256)")
    p.add_argument("--batch-size", type=_positive, default=8, help="prompts per generate call (default: 8)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--threads", type=_positive, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_distill(args) -> None:
    import torch

    from ..models.loading import load
    from ..tasks.prompts import load_prompts
    from ..training.distill import distill

    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = [p for source in args.prompts for p in load_prompts(source)]
    model, tokenizer = load(args.model, device=args.device)
    n = distill(model, tokenizer, prompts, args.out, chat=not args.no_chat, max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size, temperature=args.temperature, seed=args.seed,
                progress=not args.no_progress)
    print(f"distilled {n} new completions into {args.out} ({len(prompts)} prompts in all)")
