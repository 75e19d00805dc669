"""One table from the lm-eval runs of benchmarks/smollm2/run.sh: per run, the harness's metric and the
plug-in's decoding counts (NFE per problem, tokens per forward, seconds) read from the files it wrote.

    python benchmarks/smollm2/summarize.py [RESULTS_DIR]   (default: benchmarks/smollm2/results)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

METRICS = ("exact_match,none", "pass@1,none")


def rows(root: Path):
    for run in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.endswith(".tmp")):
        results = sorted(run.rglob("results_*.json"))
        decoding = sorted(run.rglob("decoding_*.json"))
        if not results or not decoding:
            continue
        res, dec = json.loads(results[-1].read_text()), json.loads(decoding[-1].read_text())
        for task, values in res["results"].items():
            metric = next(m for m in METRICS if m in values)
            counts = dec["tasks"][task]
            yield {"run": run.name, "task": task, "model": Path(dec["pretrained"]).name, "method": dec["method"],
                   "gamma": dec["gamma"] if dec["method"] == "sbd" else "", "block": dec["block_size"],
                   "metric": metric.split(",")[0], "value": values[metric],
                   "stderr": values.get(metric.replace(",", "_stderr,"), float("nan")),
                   "n": counts["requests"], "nfe_per_problem": counts["nfe_per_request"],
                   "tokens_per_forward": counts["tokens_per_forward"], "seconds": counts["seconds"]}


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "results")
    table = list(rows(root))
    lines = ["| task | model | decoding | metric | value ± stderr | n | NFE/problem | tokens/forward | seconds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        how = r["method"] + (f" γ={r['gamma']}" if r["gamma"] != "" else "") + (f", block {r['block']}" if r["method"] != "ntp" else "")
        lines.append(f"| {r['task']} | {r['model']} | {how} | {r['metric']} | {r['value']:.3f} ± {r['stderr']:.3f} | "
                     f"{r['n']} | {r['nfe_per_problem']:.1f} | {r['tokens_per_forward']:.2f} | {r['seconds']:.0f} |")
    text = "\n".join(lines) + "\n"
    (root / "summary.md").write_text(text)
    (root / "summary.json").write_text(json.dumps(table, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
