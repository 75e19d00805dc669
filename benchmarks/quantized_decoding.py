"""SmolLM2-135M-Instruct with its shipped drafter as `sbd.load` gives it ("defaults": the GGUF's Q4_1/Q8_0 numbers held
exactly on sbd's int4/int8 products), in float32 (the same numbers) and requantized to int8 and int4 (`sbd.load(weights=...)`):
NTP and sbd-verify's defaults, batch 1, greedy, the same chat prompts, every (format, method) pair taking
turns prompt by prompt in one process after a warm-up call each.

    python benchmarks/quantized_decoding.py --n 8 --max-new-tokens 96 --out benchmarks/results/quantized_decoding
    python benchmarks/quantized_decoding.py --accuracy 40 --out benchmarks/results/quantized_decoding
    python benchmarks/quantized_decoding.py --n 8 --max-new-tokens 96 --forwards both --out benchmarks/results/lean_forward

--forwards both: every configuration also through transformers' own modules (engine={"lean": False}), in the
same turns: sbd's own forward of Llama-family models (`sbd.decoding.llama_forward`) against what it replaces.

--accuracy N instead: N held-out questions of --task (gsm_symbolic by default; all: sbd's five tasks in turns;
bare, through the chat template, --max-answer-tokens tokens), NTP in each format (sbd-verify gives the same
tokens), final answers scored by reasoning-gym and compared with float32's final answers; int8 and int4 also on torch's kernels instead of
sbd's own products (`sbd.models.quantized`), and how many answers the two kernels write alike. Writes
accuracy.md (accuracy_TASK.md for another task).

Reports tokens/s (median over prompts of tokens / seconds, and total tokens / total seconds), tokens per
forward, whether sbd-verify gave exactly NTP's tokens of the same weights (the promise), and how many answers
each format shares with float32 NTP (what quantization does to answers). Writes results.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

from machine_name import machine

FORMATS = ("float32", "defaults", "int8", "int4")
LOAD = {"float32": "float", "defaults": True, "int8": "int8", "int4": "int4"}  # sbd.load's weights=
TORCH_KERNELS = "{} on torch's kernels"
PROMPTS = ["What is 7 * 8? Explain.", "Write a python function that adds two numbers.",
           "Name three colours and say why the sky is blue.",
           "A train leaves at 3 pm and rides 2 hours. When does it arrive?",
           "Write a haiku about the sea.", "List the planets of the solar system in order.",
           "Explain what a prime number is, with an example.", "Translate 'good morning' into French and Spanish.",
           "Sort these numbers: 5, 3, 9, 1, 4.", "What is the capital of Italy, and what is it known for?"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="prompts (up to 10)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--accuracy", type=int, default=0, help="score N held-out questions of --task instead")
    ap.add_argument("--task", default="gsm_symbolic", help="the task --accuracy scores (sbd.tasks: gsm_symbolic, "
                    "chain_sum, basic_arithmetic, number_sorting, word_sequence_reversal; all: the five in turns)")
    ap.add_argument("--max-answer-tokens", type=int, default=256, help="--accuracy: the budget of each answer")
    ap.add_argument("--forwards", choices=("sbd", "both"), default="sbd",
                    help="sbd: sbd's own forward where it supports the model (the default); both: also every "
                    "configuration through transformers' modules, interleaved, for the comparison")
    args = ap.parse_args()

    import torch

    import sbd

    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    prompts = PROMPTS[: args.n]
    models = {fmt: sbd.load("smollm2", weights=LOAD[fmt]) for fmt in FORMATS}
    if args.accuracy:
        from sbd.models import quantized

        real = quantized.sbd_products
        quantized.sbd_products = lambda: False  # the same formats on torch's kernels
        try:
            for fmt in ("int8", "int4"):
                models[TORCH_KERNELS.format(fmt)] = sbd.load("smollm2", weights=fmt)
        finally:
            quantized.sbd_products = real
        return accuracy(models, args, torch)
    forwards = ("sbd", "transformers") if args.forwards == "both" else ("sbd",)
    configs = [(fmt, method, fwd) for fmt in FORMATS for method in ("ntp", "sbd-verify") for fwd in forwards]

    def run(fmt, method, fwd, prompt):
        model, tok = models[fmt]
        return sbd.generate(model, tok, [prompt], method=method, max_new_tokens=args.max_new_tokens, chat=True,
                            engine={"lean": None if fwd == "sbd" else False})

    for c in configs:  # warm-up
        run(*c, prompts[0])
    out = {c: [] for c in configs}
    for i, p in enumerate(prompts):
        for c in configs:
            out[c].append(run(*c, p))
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    ref = [r.token_ids[0] for r in out[("float32", "ntp", "sbd")]]
    lines = ["# Quantized weights: SmolLM2-135M-Instruct + shipped drafter, NTP vs sbd-verify", "",
             f"Command: `python benchmarks/quantized_decoding.py --n {args.n} --max-new-tokens {args.max_new_tokens} "
             f"{' --forwards both' if args.forwards == 'both' else ''} --out {args.out}`  ",
             f"Machine: {machine()}, {args.threads} threads, torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  ",
             f"{len(prompts)} chat prompts, batch 1, greedy, up to {args.max_new_tokens} new tokens; the "
             f"{len(configs)} configurations in turns per prompt after a warm-up call each. forward: sbd's own "
             f"forward of Llama-family models, or transformers' modules.", "",
             "| weights | decoding | forward | median tokens/s | tokens/s (total) | tokens per forward | sbd-verify = NTP of these weights | same answer as float32 NTP |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for fmt, method, fwd in configs:
        runs = out[(fmt, method, fwd)]
        tokens = sum(r.num_tokens for r in runs)
        seconds = sum(r.seconds for r in runs)
        nfe = sum(sum(r.nfe) for r in runs)
        same_ntp = "–" if method == "ntp" else \
            f"{sum(a.token_ids == b.token_ids for a, b in zip(runs, out[(fmt, 'ntp', fwd)]))}/{len(runs)}"
        same_fp32 = sum(r.token_ids[0] == t for r, t in zip(runs, ref))
        lines.append(f"| {fmt} | {method} | {fwd} | {statistics.median(r.num_tokens / r.seconds for r in runs):.1f} | "
                     f"{tokens / seconds:.1f} | {tokens / nfe:.2f} | {same_ntp} | {same_fp32}/{len(runs)} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


ALL_TASKS = ("gsm_symbolic", "chain_sum", "basic_arithmetic", "number_sorting", "word_sequence_reversal")


def accuracy(models, args, torch) -> None:
    import sbd
    from sbd.tasks.answers import score
    from sbd.tasks.format import final_answer
    from sbd.tasks.splits import make_split

    if args.task == "all":  # the five tasks in turns, each question scored by its own task
        share = -(-args.accuracy // len(ALL_TASKS))
        per_task = [[(task, ex) for ex in make_split(task, "test", share, 0)] for task in ALL_TASKS]
        examples = [pair for group in zip(*per_task) for pair in group][: args.accuracy]
    else:
        examples = [(args.task, ex) for ex in make_split(args.task, "test", args.accuracy, 0)]
    right = {fmt: [] for fmt in models}
    texts = {fmt: [] for fmt in models}
    answers = {fmt: [] for fmt in models}
    for i, (task, ex) in enumerate(examples):
        for fmt in models:
            model, tok = models[fmt]
            out = sbd.generate(model, tok, [ex["entry"]["question"]], method="ntp", max_new_tokens=args.max_answer_tokens,
                               chat=True)
            texts[fmt].append(out.token_ids[0])
            answers[fmt].append(final_answer(out.texts[0]))
            right[fmt].append(score(task, ex["entry"], out.texts[0], chat=True) >= 1.0)
        print(f"question {i + 1}/{len(examples)} done", file=sys.stderr, flush=True)
    n = len(examples)
    base = right["float32"]
    asked = f"questions of {', '.join(ALL_TASKS)} in turns" if args.task == "all" else f"{args.task} questions"
    lines = ["# Quantized weights: what they do to SmolLM2-135M-Instruct's final answers", "",
             f"Command: `python benchmarks/quantized_decoding.py --accuracy {n} --task {args.task} --max-answer-tokens "
             f"{args.max_answer_tokens} --out {args.out}`  ",
             f"Machine: {machine()}, {args.threads} threads, torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  ",
             f"{n} held-out {asked} (seed 0), bare, through the chat template, NTP greedy, "
             f"{args.max_answer_tokens} tokens "
             "(sbd-verify gives the same tokens of each format: results.md). float32 is the GGUF's Q4_1 weights "
             "dequantized, as `sbd import` writes them; defaults: the same numbers held in the file's own int4/int8 "
             "forms on sbd's products, as `sbd.load(\"smollm2\")` gives them; int8 and int4: requantized.", "",
             "| weights | correct final answers | of float32's correct ones kept | same final answer as float32 "
             "| answers token-identical to float32 | token-identical on sbd's products and torch's kernels |",
             "|---|---:|---:|---:|---:|---:|"]
    for fmt in models:
        kept = sum(a and b for a, b in zip(right[fmt], base))
        same = sum(a == b for a, b in zip(texts[fmt], texts["float32"]))
        agree = sum(a == b for a, b in zip(answers[fmt], answers["float32"]))
        other = TORCH_KERNELS.format(fmt)
        kernels = f"{sum(a == b for a, b in zip(texts[fmt], texts[other]))}/{n}" if other in texts else "–"
        lines.append(f"| {fmt} | {sum(right[fmt])}/{n} | {kept}/{sum(base)} | {agree}/{n} | {same}/{n} | {kernels} |")
    args.out.mkdir(parents=True, exist_ok=True)
    name = "accuracy.md" if args.task == "gsm_symbolic" else f"accuracy_{args.task}.md"
    (args.out / name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
