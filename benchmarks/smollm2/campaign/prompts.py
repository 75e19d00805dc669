"""The campaign's prompt set: gsm_symbolic train questions, dozens of reasoning-gym generators and
written templates, shuffled together, each line `{"prompt": ..., "source": ...}`.

    python benchmarks/smollm2/campaign/prompts.py --out runs/campaign/prompts.jsonl

Never a held-out question: gsm_symbolic comes from the train side of sbd's split, and the reasoning-gym
tasks of the held-out "other" set (gcd, chain_sum, count_primes, word_ladder, number_sorting) and
HumanEval are left out. The same arguments always give the same file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from templates import template_prompts  # noqa: E402

HELD_OUT_TASKS = {"gcd", "chain_sum", "count_primes", "word_ladder", "number_sorting"}
# slow to generate (seconds per question) or a mixture of others
SKIP = HELD_OUT_TASKS | {"gsm_symbolic", "composite", "knight_swap", "futoshiki", "intermediate_integration",
                         "puzzle24", "zebra_puzzles", "polynomial_equations", "sokoban"}
MAX_CHARS = 2000  # longer prompts cost a long prefill for one answer


def reasoning_gym_prompts(per_task: int, seed: int) -> list[tuple[str, str]]:
    import reasoning_gym
    import reasoning_gym.factory

    out = []
    for name in sorted(reasoning_gym.factory.DATASETS):
        if name in SKIP:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = reasoning_gym.create_dataset(name, size=per_task, seed=seed)
                qs = [e["question"] for e in ds]
        except Exception as e:  # a generator that needs options we do not give
            print(f"skipped reasoning-gym {name}: {type(e).__name__}", file=sys.stderr)
            continue
        out += [(f"reasoning-gym:{name}", q) for q in qs if len(q) <= MAX_CHARS]
    return out


def gsm_prompts(n: int, seed: int) -> list[tuple[str, str]]:
    from sbd.tasks.splits import make_split

    return [("gsm_symbolic:train", e["entry"]["question"]) for e in make_split("gsm_symbolic", "train", n, seed)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="prompts file to write (.jsonl)")
    ap.add_argument("--gsm", type=int, default=7000, help="gsm_symbolic train questions (default 7000)")
    ap.add_argument("--per-task", type=int, default=150, help="questions per reasoning-gym generator (default 150)")
    ap.add_argument("--templates", type=int, default=6000, help="written-template prompts (default 6000)")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args(argv)
    items = gsm_prompts(args.gsm, args.seed) + reasoning_gym_prompts(args.per_task, args.seed) \
        + template_prompts(args.templates, args.seed)
    seen, unique = set(), []
    for source, prompt in items:
        if prompt not in seen:
            seen.add(prompt)
            unique.append((source, prompt))
    random.Random(args.seed).shuffle(unique)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for source, prompt in unique:
            f.write(json.dumps({"prompt": prompt, "source": source}) + "\n")
    tmp.replace(out)
    counts: dict[str, int] = {}
    for source, _ in unique:
        key = source.split(":")[0] if source.startswith("reasoning-gym") else source
        counts[key] = counts.get(key, 0) + 1
    print(f"{len(unique)} distinct prompts -> {out}: {counts}")


if __name__ == "__main__":
    main()
