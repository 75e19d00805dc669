"""Benchmark results as Markdown, JSON and plots (Agg backend, no display needed)."""

from __future__ import annotations

import json
from pathlib import Path


def _f(value, fmt: str, none: str = "–") -> str:
    return none if value is None else format(value, fmt)


def bench_markdown(result, command: str | None = None) -> str:
    """One table per batch size: speed, forwards, exactness, accuracy and the eq.-16 limit."""
    meta = result.meta
    lines = ["# sbd bench", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [
        (f"{meta['prompts']} prompts, greedy, max {meta['max_new_tokens']} new tokens; time = median over "
         f"{meta['repeats']} passes of the summed wall time, methods interleaved batch by batch after an untimed "
         f"recording pass. Device: {meta['device']} ({meta['processor']}), {meta['threads']} torch threads, "
         f"{meta['dtype']}, torch {meta['torch']}, transformers {meta['transformers']}; model "
         f"{meta['model_parameters'] / 1e6:.1f}M parameters."),
        "",
        ("Limit: the sum over a run's forwards of each forward's time measured alone (eq. 16 over the forwards "
         "actually made, prefill included); predicted = NTP loop's limit / the row's limit; share = measured / "
         "predicted speedup over our NTP loop. Near tie: an answer that parts from the greedy one where the "
         "model's logits for the two tokens differ by less than float rounding can decide (under 0.001 in "
         "float32, 0.03 in float16, 0.25 in bfloat16: sbd/benchmarking/ties.py; bench.json lists each gap); ✗: a lossless row with any other difference."),
        "",
    ]
    has_acc = any(r.accuracy is not None for r in result.rows)
    for b in dict.fromkeys(r.batch_size for r in result.rows):
        rows = [r for r in result.rows if r.batch_size == b]
        lines += [f"## Batch size {b}", ""]
        head = ["decoding", "tokens/s", "vs HF greedy", "NFE", "tokens / forward", "same as greedy"]
        head += ["accuracy %"] if has_acc else []
        head += ["vs our NTP", "eq.-16 limit vs NTP", "share of limit"]
        lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        for r in rows:
            ties = r.near_ties
            same = f"{r.same_as_greedy}/{r.n}" + (f" (+{ties} near tie{'s' * (ties > 1)})" if ties else "")
            same += "" if r.same_as_greedy + ties == r.n or not r.lossless else " ✗"
            cells = [r.method, f"{r.tokens_per_second:.0f}", _f(r.speedup_vs_hf, ".2f") + ("x" if r.speedup_vs_hf else ""),
                     _f(r.nfe, "d"), _f(r.tokens_per_forward, ".2f"), same]
            cells += [_f(None if r.accuracy is None else 100 * r.accuracy, ".1f")] if has_acc else []
            cells += [_f(r.measured_vs_ntp, ".2f"), _f(r.predicted_vs_ntp, ".2f"),
                      _f(None if r.share_of_limit is None else 100 * r.share_of_limit, ".0f") + ("%" if r.share_of_limit else "")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot_bench(result, path) -> Path:
    """Left: wall-clock speedup over HF greedy per method and batch size. Right: our rows' measured
    speedup over the NTP loop next to the eq.-16 limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = list(dict.fromkeys(r.batch_size for r in result.rows))
    names = list(dict.fromkeys(r.method for r in result.rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=120)
    width = 0.8 / len(batches)
    for j, b in enumerate(batches):
        by = {r.method: r for r in result.rows if r.batch_size == b}
        xs = [i + j * width for i, n in enumerate(names) if n in by and by[n].speedup_vs_hf is not None]
        ys = [by[n].speedup_vs_hf for n in names if n in by and by[n].speedup_vs_hf is not None]
        left.bar(xs, ys, width, label=f"batch {b}")
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30, ha="right", fontsize=8)
    left.set_ylabel("wall-clock speedup over HF greedy (×)")
    left.legend(fontsize=8)
    ours = [n for n in names if any(r.method == n and r.predicted_vs_ntp is not None for r in result.rows)]
    for j, b in enumerate(batches):
        by = {r.method: r for r in result.rows if r.batch_size == b and r.predicted_vs_ntp is not None}
        idx = [i for i, n in enumerate(ours) if n in by]
        right.bar([i + j * width for i in idx], [by[ours[i]].measured_vs_ntp for i in idx], width,
                  label=f"measured, batch {b}")
        right.scatter([i + j * width for i in idx], [by[ours[i]].predicted_vs_ntp for i in idx], marker="_", s=300,
                      color="black", zorder=3, label="eq.-16 limit" if j == 0 else None)
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set_xticks([i + 0.4 - width / 2 for i in range(len(ours))], ours, rotation=30, ha="right", fontsize=8)
    right.set_ylabel("speedup over our NTP loop (×)")
    right.legend(fontsize=8)
    fig.suptitle(f"sbd bench — {result.meta['device']}, {result.meta['dtype']}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_bench(result, out_dir, command: str | None = None) -> dict[str, Path]:
    """bench.json, bench.md and bench.png in `out_dir` (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "md": out / "bench.md", "png": out / "bench.png"}
    paths["json"].write_text(json.dumps({**result.to_dict(), "command": command}, indent=1))
    paths["md"].write_text(bench_markdown(result, command))
    plot_bench(result, paths["png"])
    return paths


def _paths(rows) -> list[tuple[str, bool]]:
    """The (attention, compiled) paths of forward-cost rows, in order of appearance."""
    return list(dict.fromkeys((r.attention, r.compiled) for r in rows))


def _tag(path: tuple[str, bool], paths: list) -> str:
    return "" if paths == [("auto", False)] else f" ({path[0]}{', compiled' if path[1] else ''})"


def forward_cost_markdown(rows, meta: dict, predicted=None, floor=None) -> str:
    """One line per (batch, cached): time(w)/time(1) measured (and predicted by the roofline); with
    `floor` (`sbd.benchmarking.floor.Floor`), each forward's memory floor and the measured time over it."""
    from .roofline import slowdown

    widths = sorted({r.width for r in rows})
    lines = ["# Forward cost: time(w) / time(1)", ""]
    if meta.get("command"):
        lines += [f"Command: `{meta['command']}`", ""]
    weights = f", {meta['weights']} linear layers" if meta.get("weights", "as loaded") != "as loaded" else ""
    lines += [(f"Model {meta['model']} ({meta['parameters'] / 1e6:.1f}M parameters, {meta['dtype']}{weights}) on "
               f"{meta['device']}, torch {meta['torch']}, {meta['threads']} threads; median of {meta['repeats']} "
               "rounds after warm-up, widths interleaved. w > 1: a block of w masks; w = 1: an NTP step."), ""]
    if predicted is not None:
        hw, shape = predicted
        lines += [f"Predicted: roofline of {shape.name} on {hw.name} ({hw.flops / 1e9:,.0f} GFLOP/s, "
                  f"{hw.bandwidth / 1e9:,.1f} GB/s).", ""]
    if floor is not None:
        lines += [f"Floor: the bytes a forward reads ({floor.weight_bytes / 1e6:,.1f} MB of weights as loaded, plus "
                  f"{floor.kv_bytes_per_position / 1e3:,.1f} kB per cached position and row) over this machine's read "
                  f"bandwidth ({floor.bandwidth / 1e9:,.1f} GB/s, a large tensor summed): no kernel runs a forward "
                  "faster. ×floor = measured / floor.", ""]
    attentions = _paths(rows)
    if attentions != [("auto", False)]:
        lines += ["Paths timed in the same rounds, by attention (`sbd.decoding.attention`): auto = what the engine "
                  "runs for rows of one length (no mask tensor), rows = what it runs for a ragged batch (one per-row "
                  "mask, key/value heads shared), dense = Hugging Face's SDPA with the dense mask (heads copied); "
                  "compiled = through `torch.compile` (CUDA graphs on CUDA), as `generate(compile=True)` runs it. "
                  "Ratios are to the same path's 1-token step.", ""]
    head = ["batch", "cached", "", *[f"w={w}" for w in widths]]
    lines += ["| " + " | ".join(head) + " |", "|---:|---:|---|" + "---:|" * len(widths)]
    for (b, c), a in ((cell, a) for cell in dict.fromkeys((r.batch, r.cached) for r in rows) for a in attentions):
        tag = _tag(a, attentions)
        mine = {r.width: r for r in rows if r.batch == b and r.cached == c and (r.attention, r.compiled) == a}
        ms = [f"{mine[w].ms:.2f}" if w in mine else "–" for w in widths]
        ratio = [f"{mine[w].ratio:.3f}" if w in mine else "–" for w in widths]
        lines.append(f"| {b} | {c} | ms{tag} | " + " | ".join(ms) + " |")
        lines.append(f"| | | measured ×1-token{tag} | " + " | ".join(ratio) + " |")
        if floor is not None:
            lows = {w: floor.seconds(b, c, w) * 1e3 for w in widths}
            if a == attentions[0]:
                lines.append("| | | floor ms | " + " | ".join(f"{lows[w]:.2f}" for w in widths) + " |")
            lines.append(f"| | | ×floor{tag} | " + " | ".join(f"{mine[w].ms / lows[w]:.1f}" if w in mine else "–"
                                                           for w in widths) + " |")
        if predicted is not None and a == attentions[-1]:
            hw, shape = predicted
            lines.append("| | | roofline ×1-token | "
                         + " | ".join(f"{slowdown(shape, hw, b, w, c):.3f}" for w in widths) + " |")
    return "\n".join(lines) + "\n"


def plot_forward_cost(rows, path, title: str, predicted=None) -> Path:
    """time(w)/time(1) against w (log scale), one line per (batch, cached); roofline dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .roofline import slowdown

    fig, ax = plt.subplots(figsize=(7, 4.8), dpi=120)
    colors = plt.get_cmap("tab10")
    attentions = _paths(rows)
    styles = dict(zip(attentions, ("o", "s", "^", "v", "D", "x")))
    cells = dict.fromkeys((r.batch, r.cached) for r in rows)
    for (i, (b, c)), a in ((cell, a) for cell in enumerate(cells) for a in attentions):
        mine = sorted((r for r in rows if r.batch == b and r.cached == c and (r.attention, r.compiled) == a),
                      key=lambda r: r.width)
        ws = [r.width for r in mine]
        tag = _tag(a, attentions)
        ax.plot(ws, [r.ratio for r in mine], marker=styles[a], color=colors(i % 10),
                label=f"measured{tag}, batch {b}, cached {c}")
        if predicted is not None and a == attentions[-1]:
            hw, shape = predicted
            ax.plot(ws, [slowdown(shape, hw, b, w, c) for w in ws], linestyle="--", color=colors(i % 10),
                    label=f"roofline, batch {b}, cached {c}")
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("new tokens per forward (w)")
    ax.set_ylabel("time(w) / time(1)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_forward_cost(rows, out_dir, meta: dict, predicted=None, floor=None) -> tuple[dict[str, Path], str]:
    """forward_cost.json, .md and .png in `out_dir` (created); returns the paths and the Markdown."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = forward_cost_markdown(rows, meta, predicted, floor)
    paths = {"json": out / "forward_cost.json", "md": out / "forward_cost.md", "png": out / "forward_cost.png"}
    record = {"meta": meta, "rows": [r.to_dict() for r in rows]}
    if floor is not None:
        from dataclasses import asdict

        record["floor"] = {**asdict(floor), "ms": {f"{r.batch},{r.cached},{r.width}": floor.seconds(
            r.batch, r.cached, r.width) * 1e3 for r in rows}}
    if predicted is not None:
        from dataclasses import asdict

        record["roofline"] = {"hardware": asdict(predicted[0]), "model": asdict(predicted[1])}
    paths["json"].write_text(json.dumps(record, indent=1))
    paths["md"].write_text(text)
    plot_forward_cost(rows, paths["png"], f"{meta['model']} on {meta['device']}", predicted)
    return paths, text


ROOFLINE_WIDTHS = (1, 2, 4, 8, 16, 32, 64)
SPEEDUP_BLOCKS = (8, 16, 32, 64)
NFE_SPEEDUPS = (2, 4, 8)


def _kv_label(c: int) -> str:
    return f"2^{c.bit_length() - 1}" if c > 0 and c & (c - 1) == 0 else str(c)


def _paper_vs_corrected(title, name, columns, table, cached, key) -> list[str]:
    """A Markdown table with one paper row and one corrected row per KV length."""
    lines = [title, "", "| KV length | model | " + " | ".join(f"{name}={v}" for v in columns) + " |",
             "|---|---|" + "---:|" * len(columns)]
    for c in cached:
        for which in ("paper", "corrected"):
            cells = " | ".join(f"{v:.3f}" for v in table[which][key.format(c=c)])
            lines.append(f"| {_kv_label(c) if which == 'paper' else ''} | {which} | {cells} |")
    return lines + [""]


def write_roofline(shape, hw, batches, cached, out_dir) -> tuple[dict[str, Path], str]:
    """The paper's Tables 3 and 4 from its printed code and the corrected roofline's same cells."""
    from functools import partial

    from .roofline import (PAPER_QUIRKS, block_speedup, forward_time, paper_block_speedup, paper_slowdown,
                           slowdown)

    table3 = {"paper": {}, "corrected": {}}
    table4 = {"paper": {}, "corrected": {}}
    for b in batches:
        for c in cached:
            key = f"{b}/{c}"
            table3["paper"][key] = [paper_slowdown(b, w, c) for w in ROOFLINE_WIDTHS]
            table3["corrected"][key] = [slowdown(shape, hw, b, w, c) for w in ROOFLINE_WIDTHS]
            for s in NFE_SPEEDUPS:
                table4["paper"][f"{key}/{s}"] = [paper_block_speedup(b, k, c, s) for k in SPEEDUP_BLOCKS]
                t = partial(lambda w, b=b, c=c: forward_time(shape, hw, b, w, c))
                table4["corrected"][f"{key}/{s}"] = [block_speedup(t, k, s) for k in SPEEDUP_BLOCKS]
    lines = [
        "# Roofline: what a k-token forward costs against a 1-token forward", "",
        ("**Paper** = the roofline code printed in arXiv 2509.04185 (Figures 6 and 11), run as printed; it "
         "reproduces every cell of the paper's Tables 3 and 4. Its quirks:"), "",
        *[f"- {q}" for q in PAPER_QUIRKS], "",
        (f"**Corrected** = every layer of {shape.name} (q, k, v, o, gate, up, down, attention over cache + new "
         f"tokens, output layer), each kernel max(bytes / bandwidth, FLOPs / peak), on {hw.name} "
         f"({hw.flops / 1e12:.0f} TFLOP/s linear, {hw.attention_flops / 1e12:.0f} attention, "
         f"{hw.bandwidth / 1e12:.2f} TB/s)."), "",
        "## Table 3: slowdown time(k) / time(1)", "",
    ]
    for b in batches:
        lines += _paper_vs_corrected(f"### batch {b}", "k", ROOFLINE_WIDTHS, table3, cached, f"{b}/{{c}}")
    lines += ["## Table 4: wall-clock speedup over NTP (eq. 16) at a given NFE speedup", ""]
    for s in NFE_SPEEDUPS:
        for b in batches:
            lines += _paper_vs_corrected(f"### NFE speedup {s}, batch {b}", "k", SPEEDUP_BLOCKS, table4, cached,
                                         f"{b}/{{c}}/{s}")
    text = "\n".join(lines)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from dataclasses import asdict

    paths = {"md": out / "roofline.md", "json": out / "roofline.json", "png": out / "roofline.png"}
    paths["md"].write_text(text + "\n")
    paths["json"].write_text(json.dumps({"hardware": asdict(hw), "model": asdict(shape), "widths": ROOFLINE_WIDTHS,
                                         "blocks": SPEEDUP_BLOCKS, "table3": table3, "table4": table4}, indent=1))
    _plot_roofline(table3, batches, cached, paths["png"], f"{shape.name} on {hw.name}")
    return paths, text


def _plot_roofline(table3, batches, cached, path, title) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = 256 if 256 in cached else cached[0]
    fig, ax = plt.subplots(figsize=(7, 4.8), dpi=120)
    colors = plt.get_cmap("tab10")
    for i, b in enumerate(batches):
        ax.plot(ROOFLINE_WIDTHS, table3["paper"][f"{b}/{c}"], linestyle="--", marker="x", color=colors(i),
                label=f"paper's code, batch {b}")
        ax.plot(ROOFLINE_WIDTHS, table3["corrected"][f"{b}/{c}"], marker="o", color=colors(i),
                label=f"corrected, batch {b}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per forward (k)")
    ax.set_ylabel(f"time(k) / time(1), KV length {c}")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
