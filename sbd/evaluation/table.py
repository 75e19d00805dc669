"""The Markdown tables: a summary laid out like the paper's Table 1 (rows = model / decoding / γ; per
task accuracy and NFE speedup; then the all-task wall-clock speedup and tokens/s) and a per-task detail
table with every metric of docs/method.md §5. With one task the "all tasks" rows are left out (they repeat it)."""

from __future__ import annotations

import math

from .harness import ALL_TASKS, add_totals

DASH = "–"


def config_key(row: dict) -> tuple:
    """Rows of one model decoded one way share this key (the table's row, the plot's point)."""
    return row["label"], row["method"], row["gamma"]


def fmt_gamma(gamma) -> str:
    if gamma is None:
        return DASH
    return "∞" if math.isinf(gamma) else f"{gamma:g}"


def _pct(x) -> str:
    return DASH if x is None else f"{100 * x:.1f}"


def _times(x) -> str:
    return DASH if x is None else f"{x:.2f}x"


def _num(x, digits: int = 2) -> str:
    return DASH if x is None else f"{x:.{digits}f}"


def task_order(rows: list[dict]) -> list[str]:
    """Tasks in first-seen order, then the aggregate when there is more than one task."""
    tasks = list(dict.fromkeys(r["task"] for r in rows if r["task"] != ALL_TASKS))
    return tasks + [ALL_TASKS] if len(tasks) > 1 else tasks


def _line(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def summary_table(rows: list[dict]) -> str:
    """Table 1 layout: one line per (model, decoding, γ); accuracy (%) and NFE speedup per task; with an NTP
    row, the share of final answers equal to NTP's (all tasks)."""
    rows = add_totals(rows)
    tasks = task_order(rows)
    by = {(config_key(r), r["task"]): r for r in rows}
    head = ["model", "decoding", "γ"]
    for t in tasks:
        name = "all tasks" if t == ALL_TASKS else t
        head += [f"{name} acc %", f"{name} NFE×"]
    agree = any("same_answer" in r for r in rows)
    head += ["tokens/fwd", "tokens/s", "wall-clock×"] + (["same answer as NTP %"] if agree else [])
    lines = [_line(head), _line(["---"] * 3 + ["---:"] * (len(head) - 3))]
    last = tasks[-1]
    for key in dict.fromkeys(config_key(r) for r in rows):
        label, method, gamma = key
        anchored = any(r.get("anchor") for r in rows if config_key(r) == key)
        cells = [label, method.upper() + (" anchored" if anchored else ""), fmt_gamma(gamma)]
        for t in tasks:
            r = by.get((key, t))
            cells += [_pct(r and r["accuracy"]), _times(r and r["nfe_speedup"])]
        total = by.get((key, last))
        cells += [_num(total and total["tokens_per_forward"]), _num(total and total["tokens_per_second"], 1),
                  _times(total and total["wallclock_speedup"])]
        if agree:
            cells.append(_pct(total and total.get("same_answer")))
        lines.append(_line(cells))
    return "\n".join(lines)


def detail_table(rows: list[dict]) -> str:
    """Every row: accuracy (mean score), exact % (score 1 only), mean NFE, tokens per forward, speedups,
    tokens/s, time, truncated answers (budget reached without EOS), and the share of final answers and of
    whole outputs equal to NTP's."""
    head = ["task", "model", "decoding", "γ", "block", "n", "acc %", "exact %", "mean NFE", "mean tokens", "tokens/fwd",
            "NFE×", "tokens/s", "wall-clock×", "seconds", "truncated", "same answer %", "same tokens %"]
    lines = [_line(head), _line(["---"] * 4 + ["---:"] * (len(head) - 4))]
    order = {t: i for i, t in enumerate(task_order(rows))}
    for r in sorted((r for r in rows if r["task"] in order), key=lambda r: order[r["task"]]):
        lines.append(_line([
            r["task"], r["label"], r["method"].upper() + (" anchored" if r.get("anchor") else ""),
            fmt_gamma(r["gamma"]), r["block_size"] or DASH, r["n"],
            _pct(r["accuracy"]), _pct(r.get("exact_match")), _num(r["mean_nfe"], 1), _num(r["mean_tokens"], 1),
            _num(r["tokens_per_forward"]),
            _times(r["nfe_speedup"]), _num(r["tokens_per_second"], 1), _times(r["wallclock_speedup"]),
            _num(r["seconds"], 3), r["truncated"], _pct(r.get("same_answer")), _pct(r.get("same_tokens")),
        ]))
    return "\n".join(lines)
