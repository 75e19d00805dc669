"""`sbd distill`: the model's own completions of a prompt set, as training data for its drafts."""

from __future__ import annotations

from .args import positive_int as _positive


def add_distill_parser(sub) -> None:
    p = sub.add_parser("distill", help="write the model's own completions of prompts as training data",
                       description="Decode every prompt with the model itself (greedy unless --temperature) and "
                                   "append {index, source, prompt, completion, prompt_ids, completion_ids} records "
                                   "to --out: the data a drafting adapter learns from, since sbd-verify accepts "
                                   "exactly what the model would say. --batch-size prompts are decoded at once; "
                                   "when one ends the next takes its place, so records appear in the order they "
                                   "finish. OUT.meta.json records the settings and the prompts. Resumable: the "
                                   "same command skips prompts already in --out; other prompts or settings are "
                                   "refused (sources appended after the recorded ones are allowed), and so is an "
                                   "existing file that is not distill's own output.")
    p.add_argument("--model", required=True, help="model folder (or demo, smollm2); recorded as given")
    p.add_argument("--prompts", required=True, action="append", metavar="SOURCE",
                   help="FILE.jsonl ({prompt} or {messages} per line), FILE.txt (a prompt per line), "
                        "task:NAME?split=train&n=N&seed=S (a registry task's questions) or "
                        "reasoning-gym:NAME?size=N&seed=S; repeat to combine sources (a resume may append more)")
    p.add_argument("--out", required=True, metavar="FILE.jsonl",
                   help="records are appended here; its settings go to FILE.jsonl.meta.json")
    p.add_argument("--adopt", action="store_true",
                   help="continue an --out written by an older sbd (no .meta.json): every record must answer "
                        "the prompt at its index within --max-new-tokens, and the first ones must decode again the "
                        "same with --temperature and --seed; then the sidecar is written (no effect when the "
                        "sidecar exists)")
    p.add_argument("--no-chat", action="store_true",
                   help="feed prompts as raw text (default: through the tokenizer's chat template)")
    p.add_argument("--max-new-tokens", type=_positive, default=256, help="completion budget (default: 256)")
    p.add_argument("--batch-size", type=_positive, default=8,
                   help="prompts decoded at once; may change between resumes (default: 8)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--seed", type=int, default=0,
                   help="sampling seed: prompt i samples with seed + i (default: 0; unused when greedy)")
    p.add_argument("--threads", type=_positive, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_distill(args) -> None:
    import torch

    from ..models.loading import load
    from ..tasks.prompts import load_prompts
    from ..training.distill import check, distill

    if args.threads:
        torch.set_num_threads(args.threads)
    sources = [(source, load_prompts(source)) for source in args.prompts]
    settings = dict(model_name=args.model, chat=not args.no_chat, max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature, seed=args.seed, adopt=args.adopt)
    check(sources, args.out, **settings)  # refuse a wrong --out before the model loads
    model, tokenizer = load(args.model, device=args.device)
    n = distill(model, tokenizer, sources, args.out, batch_size=args.batch_size, progress=not args.no_progress,
                **settings)
    total = sum(len(ps) for _, ps in sources)
    print(f"distilled {n} new completions into {args.out} ({total} prompts in all)")
