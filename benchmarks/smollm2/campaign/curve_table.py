"""The campaign's learning curve in one place (issue 27, item 6): every point of curve.json as a markdown
table, and a plot of held-out tokens per forward with the masks alone against the adapter's training
sequences and against the distinct answers it was trained on.

    python benchmarks/smollm2/campaign/curve_table.py            # prints the table, writes curve.png

Points are measured with different prompt counts (`n`) and, before session 3, with leftover drafts on;
the table says which, and the plot joins only points measured alike (leftover drafts off, with the sampler head). Two points of
one session on the same prompts (one process) are the fair comparison; across sessions a 1–2% change is
within what 10 prompts move.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent / "results"


def rows(points: list[dict]) -> list[str]:
    out = ["| date | drafter | adapter sequences | head sequences | distinct answers | prompts (gsm + mixed) "
           "| gsm: masks alone | mixed: masks alone | gsm: tree 3,2 + lookup | mixed: tree 3,2 + lookup | identical |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        same = [p.get(f"{s}_{c}_identical", "") for s in ("gsm", "other") for c in ("masks", "best")]
        hit = sum(int(x.split("/")[0]) for x in same if x)
        total = sum(int(x.split("/")[1]) for x in same if x)
        n_other = int(p["other_masks_identical"].split("/")[1]) if p.get("other_masks_identical") else p["n"]
        drafter = p["adapter"] + ("" if p.get("sampler_head") else " (no head)")
        drafter += " (leftover drafts on)" if p.get("leftover_drafts", True) else ""
        head = p.get("head_sequences_seen") or ("–" if not p.get("sampler_head") else "?")
        out.append(f"| {p['date']} | {drafter} | {p['sequences_seen']:,} | {head if isinstance(head, str) else f'{head:,}'} "
                   f"| {p.get('distinct_answers') or '?'} | {p['n']} + {n_other} | {p['gsm_masks_tpf']:.3f} "
                   f"| {p['other_masks_tpf']:.3f} | {p['gsm_best_tpf']:.3f} | {p['other_best_tpf']:.3f} | {hit}/{total} |")
    return out


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alike = [p for p in points if not p.get("leftover_drafts", True) and p.get("sampler_head")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, label in ((axes[0], "sequences_seen", "adapter training sequences seen"),
                           (axes[1], "distinct_answers", "distinct answers trained on")):
        for s, name in (("gsm", "held-out gsm_symbolic"), ("other", "mixed set")):
            xs = [(p[key], p[f"{s}_masks_tpf"], p["n"]) for p in alike if p.get(key)]
            ax.plot([x for x, _, _ in xs], [y for _, y, _ in xs], "o-", label=f"{name}, masks alone")
            for x, y, n in xs:
                ax.annotate(f"n={n}", (x, y), fontsize=6, textcoords="offset points", xytext=(2, 3))
        ax.axhline(2.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens per forward (greedy, block 8)")
    axes[0].legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct drafter: held-out tokens per forward, masks alone (target 2.0 on gsm)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--curve", type=Path, default=HERE / "curve.json")
    ap.add_argument("--plot", default=str(HERE / "curve.png"), help="where the plot goes ('' for none)")
    args = ap.parse_args()
    points = json.loads(args.curve.read_text())
    print("\n".join(rows(points)))
    if args.plot:
        plot(points, Path(args.plot))


if __name__ == "__main__":
    main()
