"""benchmarks/gpu/vllm_call.sh, the script a GPU machine with upstream vLLM would run: its dry run on vLLM's
CPU build (DEVICE=cpu QUICK=1) runs every step to the end and its check passes (vLLM + sbd's masks give
vLLM plain's tokens), so the script cannot rot before a GPU with vLLM is at hand. Skips where `sbd
vllm-setup` has not made vLLM's environment (CI makes it)."""

import os
import sys
import subprocess
import tarfile
from pathlib import Path

import pytest

from sbd.errors import SBDError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "vllm_call.sh"


@pytest.fixture(scope="module")
def vllm_python():
    from sbd.integrations.vllm import environment

    try:
        return environment.check()
    except SBDError as e:
        pytest.skip(f"vLLM's environment is not here: {e}")


def test_the_dry_run_runs_every_step_and_its_check_passes(vllm_python, tmp_path):
    from sbd.integrations.vllm.launch import cpu_environment

    out = tmp_path / "out"
    env = {**cpu_environment(1), "OUT": str(out), "PY": str(vllm_python), "DEVICE": "cpu", "QUICK": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    r = subprocess.run(["bash", str(SCRIPT)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    lines = (out / "steps.tsv").read_text().splitlines()[1:]
    steps = {name: int(rc) for name, rc, *_ in (line.split("\t") for line in lines)}
    assert list(steps) == ["machine", "model", "exact_plain", "exact_sbd", "cost_masks_all", "check"], r.stdout
    assert all(rc == 0 for rc in steps.values()), (steps, (out / "log.txt").read_text()[-4000:])
    summary = (out / "summary.md").read_text()
    assert "4/4 requests with vLLM plain's tokens" in summary and "(ok)" in summary, summary
    with tarfile.open(out / "results.tgz") as tar:
        assert {"./exact_plain.json", "./exact_sbd.json", "./cost_masks_all.json", "./summary.md"} <= set(tar.getnames())


def test_the_check_fails_when_a_forward_ran_eagerly(tmp_path):
    """The check can fail: a compiled run whose plug-in counted an eager forward, or other tokens."""
    import json

    tokens = [[1, 2, 3], [4, 5, 6]]
    (tmp_path / "exact_plain.json").write_text(json.dumps({"tokens": tokens}))
    stats = {"compiled": True, "forwards": 10, "eager_forwards": 1, "mask_drafts": 3, "chain_tokens": 2}
    (tmp_path / "exact_sbd.json").write_text(json.dumps({"tokens": tokens, "stats": stats}))
    check = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "vllm_check.py"), str(tmp_path)]
    r = subprocess.run(check, capture_output=True, text=True)
    assert r.returncode == 1 and "FAILED: a forward ran eagerly" in r.stdout, r.stdout + r.stderr
    stats["eager_forwards"] = 0
    (tmp_path / "exact_sbd.json").write_text(json.dumps({"tokens": [[1, 2, 3], [4, 5, 7]], "stats": stats}))
    r = subprocess.run(check, capture_output=True, text=True)
    assert r.returncode == 1 and "1/2 requests" in r.stdout, r.stdout + r.stderr
    (tmp_path / "exact_sbd.json").write_text(json.dumps({"tokens": tokens, "stats": stats}))
    r = subprocess.run(check, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
