"""benchmarks/gpu/first_call.sh, the one prepared GPU call: its full plan fits one device call, and its dry
run on this CPU (DEVICE=cpu QUICK=1) runs every step to the end, so the script cannot rot unnoticed
between the rare sessions that have a GPU."""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "first_call.sh"
STEPS = ["machine", "tests", "cost_8b", "cost_smollm2", "cost_compiled", "quant_kernels", "cost_int4", "fixed_8b",
         "train_step", "demo_compiled"]


def _run(tmp_path, timeout, **env):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": sys.executable, **env}
    return subprocess.run(["bash", str(SCRIPT)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_the_full_plan_fits_one_device_call(tmp_path):
    r = _run(tmp_path, 60, PLAN="1")
    assert r.returncode == 0, r.stdout + r.stderr
    total, budget = map(int, re.search(r": (\d+)s of (\d+)s", r.stdout).groups())
    assert total <= budget <= 560, r.stdout  # one call is at most 600 s, start-up and packing included
    files = int(re.search(r"tests \d+s \((\d+) files", r.stdout).group(1))
    assert files >= 20, r.stdout  # every file whose tests build tiny models on the device


def test_the_dry_run_runs_every_step_and_packs_every_result(tmp_path):
    r = _run(tmp_path, 1800, DEVICE="cpu", QUICK="1")  # upper bounds: the dry run takes ~3-5 minutes alone
    out = tmp_path / "out"
    lines = (out / "steps.tsv").read_text().splitlines()[1:]
    steps = {name: int(rc) for name, rc, *_ in (line.split("\t") for line in lines)}
    assert list(steps) == STEPS, r.stdout
    assert all(rc == 0 for rc in steps.values()), (steps, (out / "log.txt").read_text()[-4000:])
    with tarfile.open(out / "results.tgz") as tar:
        names = set(tar.getnames())
        assert {"./cost_8b/forward_cost.json", "./cost_smollm2/forward_cost.json", "./cost_compiled/forward_cost.json",
                "./quant_kernels/quant_kernels.json", "./cost_int4/forward_cost.json", "./fixed_8b/bench.json",
                "./demo_compiled/bench.json", "./tests/summary.txt"} <= names, names
        cost = json.load(tar.extractfile("./cost_8b/forward_cost.json"))
        int4 = json.load(tar.extractfile("./cost_int4/forward_cost.json"))
        kernels = json.load(tar.extractfile("./quant_kernels/quant_kernels.json"))
        summary = tar.extractfile("./tests/summary.txt").read().decode()
    assert {row["attention"] for row in cost["rows"]} == {"auto", "rows", "dense"}
    assert int4["meta"]["weights"] == "int4" and cost["meta"]["weights"] == "as loaded"
    assert {row["format"] for row in kernels["rows"]} == {"bf16", "int8", "int4"}
    assert "exit 0" in summary and "passed" in summary, summary
