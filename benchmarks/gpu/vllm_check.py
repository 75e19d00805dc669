"""What the vLLM GPU call's runs say (benchmarks/gpu/vllm_call.sh): exactness, eager forwards, step costs.

    python benchmarks/gpu/vllm_check.py WORK_FOLDER      (any python: reads the runs' JSON files only)

Reads the `tests/vllm/run_vllm.py` results the script wrote and writes WORK_FOLDER/summary.md:
- exact: vLLM + sbd's masks (float32) gave vLLM plain's tokens, request for request;
- eager: forwards of the plug-in's model that ran eagerly while vLLM compiled (must be 0);
- cost: seconds per engine step of vLLM plain, of the plug-in never drafting (its plain steps: the gate's
  price) and of the plug-in with masks every step (a block's price), at batch 1 and 16 at once.
Exits 1 when exactness or the no-eager rule fails, so the call's steps.tsv shows it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def load(folder: Path, name: str) -> dict | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def step_seconds(run: dict, batch: str) -> float | None:
    """Median seconds per engine step of a timed run (vLLM plain: one step per token of its longest request)."""
    if run is None:
        return None
    seconds = statistics.median(run["seconds"])
    steps = run["stats"].get("engine_steps") if run.get("stats") else None
    if not steps:  # vLLM plain: no proposer; every step yields one token per request
        steps = max(map(len, run["tokens"])) if batch == "all" else sum(map(len, run["tokens"]))
    else:
        steps = steps / max(1, len(run["seconds"]))
    return seconds / steps


def main() -> int:
    folder = Path(sys.argv[1])
    lines, ok = ["# sbd's vLLM plug-in on this machine", ""], True
    plain, masks = load(folder, "exact_plain"), load(folder, "exact_sbd")
    if plain and masks:
        same = sum(a == b for a, b in zip(plain["tokens"], masks["tokens"]))
        st = masks["stats"]
        exact = same == len(plain["tokens"]) and st.get("mask_drafts", 0) > 0
        eager_ok = not st.get("compiled") or st.get("eager_forwards", 1) == 0
        ok = ok and exact and eager_ok
        lines += [f"- exact (float32): {same}/{len(plain['tokens'])} requests with vLLM plain's tokens; "
                  f"{st.get('mask_drafts', 0)} mask drafts, {st.get('chain_tokens', 0)} chain tokens "
                  f"{'(ok)' if exact else '(FAILED)'}",
                  f"- compiled: {st.get('compiled')}; forwards {st.get('forwards')}, of them eager "
                  f"{st.get('eager_forwards')} {'(ok)' if eager_ok else '(FAILED: a forward ran eagerly)'}"]
    else:
        ok = False
        lines.append("- exact: runs missing (see log.txt)")
    lines += ["", "| batch | vLLM plain s/step | plug-in, no drafts | ratio | plug-in, masks every step | ratio |",
              "|---|---:|---:|---:|---:|---:|"]
    for batch in ("1", "all"):
        base = step_seconds(load(folder, f"cost_plain_{batch}"), batch)
        idle = step_seconds(load(folder, f"cost_idle_{batch}"), batch)
        block = step_seconds(load(folder, f"cost_masks_{batch}"), batch)

        def cell(x):
            return "–" if x is None else f"{x * 1e3:.2f} ms"

        def ratio(x):
            return "–" if x is None or not base else f"{x / base:.2f}x"
        lines.append(f"| {'1' if batch == '1' else 'all at once'} | {cell(base)} | {cell(idle)} | {ratio(idle)} | "
                     f"{cell(block)} | {ratio(block)} |")
    text = "\n".join(lines) + "\n"
    (folder / "summary.md").write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
