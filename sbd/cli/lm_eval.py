"""`sbd lm-eval ...`: lm-evaluation-harness's own command line, with the `sbd` model registered and
sbd's offline tasks on the include path; decoding counts are written next to the harness's results.

Every argument is the harness's (`sbd lm-eval --help` prints its help). Released lm-eval versions
(<= 0.4.13) resolve `--model` only among models imported before they parse it, so the plain `lm_eval`
command does not see `sbd`; the package also declares the `lm_eval.models` entry point for harness
versions that load installed plug-ins.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..errors import SBDError

TASKS_DIR = Path(__file__).resolve().parent.parent / "evaluation" / "lm_eval_tasks"
SUMMARY = "lm-evaluation-harness with the sbd model and sbd's offline tasks (arguments: lm_eval's own)"


def add_lm_eval_parser(sub) -> None:
    """Listed in `sbd --help`; `main` hands the arguments to the harness untouched."""
    sub.add_parser("lm-eval", help=SUMMARY, add_help=False)


def _option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _results_file(output_path: str | None, since: float) -> Path | None:
    """The harness's results file written by this run, if it wrote one."""
    if not output_path:
        return None
    root = Path(output_path)
    found = [p for p in ([root] if root.is_file() else root.rglob("results*.json"))
             if p.suffix == ".json" and p.stat().st_mtime >= since]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def print_stats(stats: dict) -> None:
    """The decoding counts as a table, under one line of the settings the decoding read (a setting the
    method does not read is None in `stats` and left out)."""
    from ..decoding.defaults import VerifySettings

    read = [stats["method"]]
    if stats.get("anchor"):
        read.append("anchored")
    if stats.get("gamma") is not None:
        read.append(f"gamma={stats['gamma']}, proxy {stats['proxy']}")
    if stats.get("block_size") is not None:
        read.append(f"block {stats['block_size']}")
    if stats.get("drafting"):
        d = stats["drafting"]
        read.append(VerifySettings(d["draft"], d["lookup"], d["lookup_max"], tuple(d["tree"] or ()) or None,
                                   price_first_draft=d.get("first_draft") == "priced").describe())
    print(f"\nsbd decoding ({', '.join(read)}, batch {stats['batch_size']}, {stats['device']} {stats['dtype']}):")
    print("| task | requests | tokens | NFE | tokens/forward | NFE/request | seconds | tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, c in stats["tasks"].items():
        tpf = f"{c['tokens_per_forward']:.2f}" if c["tokens_per_forward"] else "-"
        nfe = f"{c['nfe_per_request']:.1f}" if c["nfe_per_request"] else "-"
        tps = f"{c['tokens_per_second']:.1f}" if c["tokens_per_second"] else "-"
        print(f"| {name} | {c['requests']} | {c['tokens']} | {c['nfe']} | {tpf} | {nfe} | {c['seconds']:.1f} | {tps} |")


def _check_tasks(tasks: str | None, include_path: str | None) -> None:
    """Unknown task names are one line naming where tasks come from (the harness would print a traceback)."""
    if not tasks or tasks == "list" or tasks.startswith("list_"):
        return
    names = [t for t in tasks.split(",") if t and not any(c in t for c in "*?[") and not Path(t).exists()]
    if not names:
        return
    from lm_eval.tasks import TaskManager

    known = set(TaskManager(include_path=include_path or str(TASKS_DIR)).all_tasks)
    unknown = [t for t in names if t not in known]
    if unknown:
        raise SBDError(f"unknown lm-eval task(s) {', '.join(unknown)}: tasks come from lm-eval's own registry and "
                       f"sbd's offline tasks in {TASKS_DIR} (sbd_gsm_symbolic, sbd_humaneval, sbd_reasoning, ...); "
                       "`sbd lm-eval --tasks list` lists them")


def run_lm_eval(argv: list[str]) -> None:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise SBDError("sbd lm-eval needs lm-evaluation-harness: pip install 'sbd-lm[eval]'") from None
    from ..evaluation import lm_eval_model  # registers the "sbd" model

    argv = list(argv)
    if _option(argv, "--include_path") is None and argv and argv[0] not in ("-h", "--help"):
        argv += ["--include_path", str(TASKS_DIR)]
    _check_tasks(_option(argv, "--tasks", "-t"), _option(argv, "--include_path"))
    started = time.time()
    saved, sys.argv = sys.argv, ["lm_eval", *argv]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    model = lm_eval_model.last_model()
    if model is None or not model.counts:
        return
    stats = model.stats()
    print_stats(stats)
    results = _results_file(_option(argv, "--output_path", "-o"), started)
    if results is not None:
        path = results.with_name("decoding" + results.stem[len("results"):] + ".json")
        path.write_text(json.dumps(stats, indent=2) + "\n")
        print(f"decoding counts written to {path}")
