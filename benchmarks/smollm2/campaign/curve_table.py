"""The campaign's learning curve in one place: every point of curve.json as a markdown
table, and a plot of held-out tokens per forward with the masks alone against the adapter's training
sequences and against the distinct answers it was trained on.

    python benchmarks/smollm2/campaign/curve_table.py            # prints the table, writes curve.png

Points are measured with different prompt counts (`n`) and, before session 3, with leftover drafts on;
the table says which, and the plot joins only points measured alike (leftover drafts off, with the sampler head). Two points of
one session on the same prompts (one process) are the fair comparison; across sessions a 1–2% change is
within what 10 prompts move.

Below the table it prints what the curve says about budget (the campaign's rule: "if a target is missed, say what
budget would close it"): a least-squares line of masks-alone tokens per forward against the logarithm of
the adapter's sequences (and of distinct answers), fitted to the points of the newest prompt set, and
where that line crosses the target. An extrapolation, not a promise: the line assumes each doubling
keeps buying what the measured doublings did.
"""

from __future__ import annotations

import argparse
import json
import math
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


def newest_alike(points: list[dict]) -> list[dict]:
    """One point per drafter, measured like the newest point (same prompt files and count, with the head)."""
    last = points[-1]
    seen, out = set(), []
    for p in points:
        if p.get("sets") != last.get("sets") or p["n"] != last["n"] or not p.get("sampler_head"):
            continue
        if p["sequences_seen"] in seen:
            continue
        seen.add(p["sequences_seen"])
        out.append(p)
    return out


def log_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b ln x; returns (a, b)."""
    lx = [math.log(x) for x in xs]
    mx, my = sum(lx) / len(lx), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in lx)
    b = sum((x - mx) * (y - my) for x, y in zip(lx, ys)) / var
    return my - b * mx, b


def budget(points: list[dict], target: float = 2.0) -> list[str]:
    """What the newest points say it would take to reach `target` tokens per forward, masks alone."""
    pts = newest_alike(points)
    if len(pts) < 3:
        return ["(fewer than 3 points on the newest prompt set: no budget line)"]
    out = [f"Budget, from {len(pts)} points on the newest prompt set ({pts[0]['sets']}, n={pts[0]['n']}):"]
    for key, what in (("sequences_seen", "adapter sequences"), ("distinct_answers", "distinct answers")):
        use = [p for p in pts if p.get(key)]
        for s, name in (("gsm", "gsm"), ("other", "mixed")):
            a, b = log_fit([p[key] for p in use], [p[f"{s}_masks_tpf"] for p in use])
            last = use[-1]
            if b <= 0:
                out.append(f"- {name} vs {what}: no gain per doubling in these points")
                continue
            need = math.exp((target - a) / b)
            out.append(f"- {name}, masks alone, vs {what}: +{b * math.log(2):.3f} tokens per forward per doubling; "
                       f"{target} at about {need:,.0f} ({need / last[key]:.1f}x the newest point's {last[key]:,})")
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
    print()
    print("\n".join(budget(points)))
    if args.plot:
        plot(points, Path(args.plot))


if __name__ == "__main__":
    main()
