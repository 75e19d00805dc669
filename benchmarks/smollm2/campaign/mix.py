"""The training file of one campaign session: every answer distilled since the last run, plus a seeded
random share of the older ones, so that the adapter learns the new answers without drifting from
what it already drafts well.

    python benchmarks/smollm2/campaign/mix.py --new-after 5370 --old-share 1.0 --seed 7 \
        --out runs/campaign/train7.jsonl

Older answers are the 800 of benchmarks/smollm2/data/smollm2_self_distilled.jsonl.gz and the first
--new-after records of runs/campaign/distill.jsonl; the new ones are the records after them. Prints the
counts; the output lists the new answers and the sampled old ones in one shuffled order.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
OLDEST = HERE.parent / "data" / "smollm2_self_distilled.jsonl.gz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="runs/campaign", help="folder of distill.jsonl")
    ap.add_argument("--new-after", type=int, required=True,
                    help="records of distill.jsonl that earlier sessions already trained on")
    ap.add_argument("--old-share", type=float, default=1.0, help="older answers drawn per new answer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with gzip.open(OLDEST, "rt", encoding="utf-8") as f:
        oldest = [line for line in f if line.strip()]
    with open(Path(args.work) / "distill.jsonl", encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    if not 0 <= args.new_after <= len(lines):
        raise SystemExit(f"--new-after {args.new_after}: distill.jsonl holds {len(lines)} records")
    old, new = oldest + lines[: args.new_after], lines[args.new_after:]
    rng = random.Random(args.seed)
    picked = rng.sample(old, min(len(old), round(args.old_share * len(new))))
    rows = new + picked
    rng.shuffle(rows)
    with open(args.out, "w", encoding="utf-8") as f:
        f.writelines(r if r.endswith("\n") else r + "\n" for r in rows)
    print(json.dumps({"new": len(new), "old_drawn": len(picked), "old_pool": len(old), "out": args.out}))


if __name__ == "__main__":
    main()
