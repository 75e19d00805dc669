"""Writing an evaluation: results.json (rows + metadata about the machine and the run), results.md (the
Table-1-style summary and a detail table) and accuracy_vs_speedup.png. Rows of several models can be
passed together (e.g. an NTP-trained baseline and an SBD-trained model) and are compared side by side."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from pathlib import Path

from .harness import add_totals
from .plot import plot_accuracy_vs_speedup
from .table import detail_table, summary_table

FILES = {"json": "results.json", "markdown": "results.md", "plot": "accuracy_vs_speedup.png"}


def machine_metadata() -> dict:
    """Where and with what the numbers were measured (timings mean nothing without this)."""
    import torch
    import transformers

    from .._version import __version__

    return {
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "sbd": __version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def model_metadata(model) -> dict:
    """dtype and device of the weights: every timing is reported with both (docs/method.md §5)."""
    weight = next(model.parameters())
    return {"dtype": str(weight.dtype).replace("torch.", ""), "device": str(weight.device)}


def _jsonable(value):
    """Strict JSON: infinite γ or speedups become the string "inf" (json.dumps would write Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else None)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json(rows: list[dict], path, meta: dict) -> Path:
    """The rows and metadata; each row's token ids (kept in memory for agreement with NTP) are left out."""
    path = Path(path)
    rows = [{k: v for k, v in r.items() if k != "token_ids"} for r in rows]
    path.write_text(json.dumps(_jsonable({"meta": meta, "rows": rows}), indent=2, ensure_ascii=False,
                               allow_nan=False) + "\n", encoding="utf-8")
    return path


def _settings(rows: list[dict], meta: dict) -> str:
    first = rows[0]
    blocks = sorted({r["block_size"] for r in rows if r["block_size"]})
    parts = [f"{first['n']} held-out problems per task (seed {first['seed']})" if first["task"] != "all" else "",
             f"block size {', '.join(map(str, blocks))}" if blocks else "",
             f"max new tokens {first['max_new_tokens']}", f"batch size {first['batch_size']}",
             f"time = median of {first['repeats']} run(s) after a warm-up", "greedy decoding"]
    machine = [f"{meta[k]}" for k in ("platform",) if k in meta]
    if "cpu_count" in meta:
        machine.append(f"{meta['cpu_count']} CPUs, {meta.get('torch_threads')} torch threads")
    for k in ("device", "dtype"):
        if k in meta:
            machine.append(f"{k} {meta[k]}")
    if "torch" in meta:
        machine.append(f"torch {meta['torch']}, transformers {meta.get('transformers')}")
    return "; ".join(p for p in parts if p) + ".\n\nMachine: " + "; ".join(machine) + "."


def markdown(rows: list[dict], meta: dict) -> str:
    """The whole results.md: settings, summary table, definitions, detail table."""
    out = ["# Evaluation results", ""]
    if meta.get("command"):
        out += [f"Command: `{meta['command']}`", ""]
    out += [_settings(rows, meta), "", "## Summary (layout of the paper's Table 1)", "", summary_table(rows), "",
            "acc % = reasoning-gym's score of the extracted answer; NFE× = NFE of NTP decoding / NFE of this "
            "decoding, same model and prompts (prefill excluded); tokens/fwd, tokens/s and wall-clock× are over "
            "all tasks (wall-clock× = NTP time / this time, same process, after warm-up).", "",
            "## Per task", "", detail_table(rows), ""]
    return "\n".join(out)


def write_report(rows: list[dict], out_dir, meta: dict | None = None) -> dict[str, Path]:
    """Write results.json, results.md and accuracy_vs_speedup.png into `out_dir` (created); returns their
    paths by kind. `meta` (model label, command line, dtype, ...) is merged over the machine metadata.
    Rows of several models may be mixed; missing "all tasks" rows are added (`harness.add_totals`)."""
    if not rows:
        raise ValueError("no rows to report")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {**machine_metadata(), **(meta or {})}
    rows = add_totals(rows)
    paths = {k: out_dir / name for k, name in FILES.items()}
    write_json(rows, paths["json"], meta)
    paths["markdown"].write_text(markdown(rows, meta), encoding="utf-8")
    plot_accuracy_vs_speedup(rows, paths["plot"])
    return paths
