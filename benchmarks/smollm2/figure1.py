"""The paper's Figure 1 on SmolLM2: accuracy and final-answer agreement with NTP decoding of the original
model, against forwards saved (NFE speedup), across γ, from `sbd eval --chat` result folders (each with
its NTP row, so each folder's speedups are against NTP of the same model in the same process).

    python benchmarks/smollm2/figure1.py benchmarks/smollm2/results/figure1_anchored \
        benchmarks/smollm2/results/figure1_plain_sbd45 --out benchmarks/smollm2/results/figure1

writes figure1.md (one table, with the command of every input) and figure1.png.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

TARGET = {"nfe_speedup": 2.0, "accuracy_drop": 0.01, "same_answer": 0.90}  # the target point


def load(folder: Path) -> tuple[dict, list[dict]]:
    data = json.loads((folder / "results.json").read_text())
    return data["meta"], data["rows"]


def name(row: dict, meta: dict) -> str:
    if row["method"] == "ntp":
        return "NTP"
    if row["method"] == "sbd-verify":
        return "SBD-verify (defaults)"
    return ("SBD anchored" if row.get("anchor") else "SBD (paper)") + f" · {meta['label']}"


def gamma(value) -> str:
    if value is None:
        return "–"
    return "∞" if value == "inf" or (isinstance(value, float) and math.isinf(value)) else f"{value:g}"


def meets(row: dict, ntp: dict) -> bool:
    return (row["nfe_speedup"] or 0) >= TARGET["nfe_speedup"] and \
        row["accuracy"] >= ntp["accuracy"] - TARGET["accuracy_drop"] and row["same_answer"] >= TARGET["same_answer"]


def table(inputs: list[tuple[dict, list[dict]]]) -> tuple[str, list[dict]]:
    tasks = [r["task"] for r in inputs[0][1] if r["method"] == "ntp" and r["task"] != "all"]
    head = ["decoding", "γ"] + [f"{t} {c}" for t in tasks for c in ("acc %", "same answer %", "NFE×")] + \
        ["all: same answer %", "all: NFE×", "meets target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    points, shown_ntp = [], False
    for meta, rows in inputs:
        by = {(r["task"], r["method"], r["gamma"] if not isinstance(r["gamma"], str) else float(r["gamma"])): r
              for r in rows}
        configs = list(dict.fromkeys((r["method"], r["gamma"]) for r in rows))
        for method, g in configs:
            if method == "ntp" and shown_ntp:
                continue
            shown_ntp = shown_ntp or method == "ntp"
            g_key = float(g) if isinstance(g, str) else g
            cells = [name(by[(tasks[0], method, g_key)], meta), gamma(g)]
            for t in tasks:
                r = by[(t, method, g_key)]
                cells += [f"{100 * r['accuracy']:.1f}", f"{100 * r['same_answer']:.0f}", f"{r['nfe_speedup']:.2f}x"]
            total = by[("all", method, g_key)]
            ntp_total = by[("all", "ntp", None)]
            ok = all(meets(by[(t, method, g_key)], by[(t, "ntp", None)]) for t in tasks)
            cells += [f"{100 * total['same_answer']:.0f}", f"{total['nfe_speedup']:.2f}x",
                      "–" if method == "ntp" else ("yes" if ok else "no")]
            lines.append("| " + " | ".join(cells) + " |")
            points.append({"name": cells[0], "gamma": g, "method": method, "nfe_speedup": total["nfe_speedup"],
                           "same_answer": total["same_answer"], "accuracy": total["accuracy"],
                           "ntp_accuracy": ntp_total["accuracy"]})
    return "\n".join(lines), points


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120)
    for ax, key, label in ((axes[0], "accuracy", "accuracy (mean over tasks, %)"),
                           (axes[1], "same_answer", "final answer = NTP's (%)")):
        for series in dict.fromkeys(p["name"] for p in points if p["method"] == "sbd"):
            mine = sorted((p for p in points if p["name"] == series), key=lambda p: float(p["gamma"]))
            ax.plot([p["nfe_speedup"] for p in mine], [100 * p[key] for p in mine], marker="o", label=series)
        for p in points:
            if p["method"] != "sbd":
                ax.scatter([p["nfe_speedup"]], [100 * p[key]], marker="s", zorder=3)
                ax.annotate(p["name"], (p["nfe_speedup"], 100 * p[key]), fontsize=7, xytext=(4, 4),
                            textcoords="offset points")
        ax.axvline(TARGET["nfe_speedup"], color="grey", linestyle=":", linewidth=1)
        if key == "same_answer":
            ax.axhline(100 * TARGET["same_answer"], color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("forwards saved (NFE speedup vs NTP)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct: plain SBD across γ (the paper's Figure 1), against NTP of the original model")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="sbd eval --chat result folders")
    ap.add_argument("--out", required=True, help="folder for figure1.md and figure1.png")
    args = ap.parse_args()
    inputs = [load(Path(f)) for f in args.folders]
    text, points = table(inputs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(points, out / "figure1.png")
    meta = inputs[0][0]
    commands = "\n".join(f"    {m['command']}" for m, _ in inputs)
    (out / "figure1.md").write_text(
        "# Plain SBD across γ on SmolLM2-135M-Instruct (the paper's Figure 1)\n\n"
        f"Written by `python benchmarks/smollm2/figure1.py {' '.join(args.folders)} --out {args.out}` from:\n\n"
        f"{commands}\n\n"
        f"Machine: {meta.get('processor')}, {meta.get('torch_threads')} thread(s), torch {meta.get('torch')}, "
        f"transformers {meta.get('transformers')}, {meta.get('date')}. Held-out problems (seed 0), the bare "
        "question through the chat template, greedy; the final answer is the reply's `Answer:` line, else its "
        "last number. \"same answer\": the final answer equals NTP decoding's of the original model (the "
        "shipped adapter never changes the next-token head). NFE× = NTP's forwards / this decoding's. Target "
        f"(per task): ≥ {TARGET['nfe_speedup']:g}x fewer forwards, accuracy within "
        f"{100 * TARGET['accuracy_drop']:g} point of NTP's, ≥ {100 * TARGET['same_answer']:g}% same final answers.\n\n"
        f"{text}\n\n![figure 1](figure1.png)\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
