"""Accuracy against NFE speedup, like the paper's Figure 1: one curve per task over γ for each model
decoded with SBD, starting from its own NTP decoding at 1x; models evaluated with NTP only (e.g. the
NTP-trained baseline) are dashed horizontal lines in the task's colour."""

from __future__ import annotations

from pathlib import Path

from .harness import ALL_TASKS
from .table import fmt_gamma, task_order


def plot_accuracy_vs_speedup(rows: list[dict], path) -> Path:
    """Write the PNG to `path` (Agg backend, no display needed) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = task_order(rows)
    labels = list(dict.fromkeys(r["label"] for r in rows))
    sbd_labels = [lab for lab in labels if any(r["label"] == lab and r["method"] == "sbd" for r in rows)]
    styles = ["-", ":", "-.", (0, (5, 1))]
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    for ti, task in enumerate(tasks):
        color = "black" if task == ALL_TASKS else colors(ti % 10)
        name = "mean over tasks" if task == ALL_TASKS else task
        for label in labels:
            mine = [r for r in rows if r["task"] == task and r["label"] == label]
            ntp = next((r for r in mine if r["method"] == "ntp"), None)
            sbd = sorted((r for r in mine if r["method"] == "sbd" and r["nfe_speedup"] is not None),
                         key=lambda r: r["gamma"])
            if label not in sbd_labels:
                if ntp is not None:
                    ax.axhline(100 * ntp["accuracy"], color=color, linestyle="--", linewidth=1, alpha=0.8,
                               label=f"{name}: {label} (NTP)")
                continue
            style = styles[sbd_labels.index(label) % len(styles)]
            points = ([ntp] if ntp is not None else []) + sbd
            xs = [r["nfe_speedup"] if r["method"] == "sbd" else 1.0 for r in points]
            ax.plot(xs, [100 * r["accuracy"] for r in points], linestyle=style, marker="o", color=color,
                    label=f"{name}: {label}" if len(labels) > 1 else name)
            if ntp is not None:
                ax.plot([1.0], [100 * ntp["accuracy"]], marker="s", markersize=9, markerfacecolor="none",
                        color=color, linestyle="none")
            for r in sbd:
                ax.annotate(f"γ={fmt_gamma(r['gamma'])}", (r["nfe_speedup"], 100 * r["accuracy"]),
                            textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    return _save(fig, ax, "NFE speedup over NTP decoding (×)", "accuracy (%)",
                 "Accuracy vs forward-pass speedup (□ = NTP decoding, dashed = NTP-only model)", "best", path)


def plot_learning_curves(runs: dict[str, list[dict]], path) -> Path:
    """Held-out masked (left context) and NTP top-1 accuracy against training steps, from the
    `masked_acc` / `ntp_acc` lines `sbd train --eval-data` writes to metrics.jsonl; one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    colors = plt.get_cmap("tab10")
    for i, (name, logs) in enumerate(runs.items()):
        points = [r for r in logs if "masked_acc" in r]
        steps = [r["step"] for r in points]
        ax.plot(steps, [r["ntp_acc"] for r in points], color=colors(i), linestyle="-", marker="s", markersize=3,
                label=f"{name}: NTP")
        ax.plot(steps, [r["masked_acc"] for r in points], color=colors(i), linestyle="--", marker="o", markersize=3,
                label=f"{name}: masked, left context")
    return _save(fig, ax, "training step", "held-out top-1 accuracy, teacher-forced (%)",
                 "Masked vs next-token prediction while training (sbd convergence)", "lower right", path)


def _save(fig, ax, xlabel: str, ylabel: str, title: str, legend_loc: str, path) -> Path:
    """Labels, grid and legend in the house style, then the PNG."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.title.set_fontsize(9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc=legend_loc)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
