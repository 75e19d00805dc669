"""Paired speed ratios of an interleaved engine run (`bench_engines.py --interleaved`): for every pass, set
and batch mode, one engine's tokens/s over another's in the same pass (they ran one after the other), and
the median over passes. Pairing cancels the machine's slow and fast spells that the per-engine medians of
engines.md keep.

    python benchmarks/vllm/paired.py benchmarks/vllm/results/engines_interleaved

Writes paired.md in the folder and prints it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def rates(path: Path) -> dict:
    """(pass, set, batch) -> tokens/s of one engine's result file."""
    runs = json.loads(path.read_text())["runs"]
    return {(r["pass"], r["set"], r["batch"]): r["generated"] / r["seconds"] for r in runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--engine", default="sbd", help="the engine compared (default sbd)")
    ap.add_argument("--against", default="plain,ngram", help="engines it is compared with")
    args = ap.parse_args()
    folder = Path(args.folder)
    mine = rates(folder / f"vllm_{args.engine}.json")
    lines = [f"# Paired ratios: vLLM {args.engine} against {', '.join(args.against.split(','))}, per pass", "",
             f"Command: `python {' '.join(sys.argv)}`", "",
             "| against | set | batch | per-pass ratios | median |", "|---|---|---|---|---:|"]
    for other in args.against.split(","):
        theirs = rates(folder / f"vllm_{other}.json")
        for key in sorted({(s, b) for _, s, b in mine}):
            ratios = [mine[(p, *key)] / theirs[(p, *key)] for p in sorted({p for p, *_ in mine})
                      if (p, *key) in theirs]
            batch = "1" if key[1] == "1" else "all at once"
            lines.append(f"| vLLM {other} | {key[0]} | {batch} | {', '.join(f'{r:.2f}' for r in ratios)} | "
                         f"{statistics.median(ratios):.2f}x |")
    text = "\n".join(lines) + "\n"
    (folder / "paired.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
