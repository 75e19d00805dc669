"""`sbd train` never reports success for a run that did nothing useful, and never loses work (issue 53,
items 8 and 11): SIGTERM saves a checkpoint like Ctrl-C and exits 143; a NaN/inf gradient norm stops the run
in one line and saves nothing after it; a schedule that cannot decay is refused; --seed repeats an adapter
run bit for bit. All on the shipped demo model (sbd/demo_model/ntp)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

import sbd
from sbd.cli import main
from sbd.errors import SBDError
from sbd.training import checkpoints as ckpt
from sbd.training.collator import SBDDataCollator
from sbd.training.data import tokenize_records
from sbd.training.trainer import SBDTrainer, sbd_training_args

DEMO = Path(sbd.__file__).resolve().parent / "demo_model" / "ntp"
WAIT_S = 300  # an upper bound only: every wait below ends as soon as what it waits for happens
TIMING = {"tokens_per_s", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("stops") / "toy.jsonl"
    with open(path, "w") as f:
        for s in range(16):
            f.write(json.dumps({"prompt": f"{s} + 1 =", "completion": f" {s + 1}"}) + "\n")
    return path


def _metrics(out: Path) -> list[dict]:
    try:
        text = (out / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _start(argv, logs: Path) -> subprocess.Popen:
    threads = os.environ.get("SBD_TEST_THREADS", "2")
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    return subprocess.Popen([sys.executable, "-m", "sbd.console", *argv], stdout=open(logs / "stdout", "w"),
                            stderr=open(logs / "stderr", "w"), env=env)


def _wait_for_step(proc, out: Path, logs: Path, step: int) -> None:
    """Until metrics.jsonl holds a logged step >= `step` (the run is then past it)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if any(r.get("step", 0) >= step and "loss" in r for r in _metrics(out)):
            return
        if proc.poll() is not None:
            pytest.fail(f"sbd train ended ({proc.returncode}) before step {step}: "
                        f"{(logs / 'stdout').read_text()}{(logs / 'stderr').read_text()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"sbd train logged no step {step} within {WAIT_S} s")


def _terminate(proc, logs: Path) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("sbd train did not stop after SIGTERM")
    return (logs / "stdout").read_text(), (logs / "stderr").read_text()


def test_sigterm_saves_a_checkpoint_of_the_current_step_and_exits_143(data, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--model", str(DEMO), "--data", str(data), "--out", str(out), "--steps", "100000",
            "--batch-size", "2", "--max-len", "32", "--logging-steps", "1", "--save-steps", "3", "--no-progress"]
    stopped = []
    for attempt in ("first", "resumed"):
        logs = tmp_path / attempt
        logs.mkdir()
        proc = _start(argv + (["--resume"] if stopped else []), logs)
        past = (stopped[-1] if stopped else 3) + 1  # a step after the last checkpoint: its work is not saved yet
        _wait_for_step(proc, out, logs, past)
        stdout, stderr = _terminate(proc, logs)
        assert proc.returncode == 143, (stdout, stderr)
        assert stderr.splitlines() == ["sbd: terminated"], stderr  # one line, no traceback
        assert "Traceback" not in stdout
        step = max(r["step"] for r in _metrics(out))  # the step it stopped at: logged, then saved
        assert step >= past
        assert f"stopped at step {step} by SIGTERM: checkpoint saved in {out / f'checkpoint-{step}'}" in stdout
        saved = out / f"checkpoint-{step}"
        assert ckpt.latest_checkpoint(out) == saved and ckpt.damage(saved) is None  # complete, resumable
        model, _ = sbd.load(saved, probe=False)  # a model folder as any other
        assert all(torch.isfinite(p).all() for p in model.parameters())
        stopped.append(step)
    # the resumed run went on from the first stop: every step logged once, in order
    assert [r["step"] for r in _metrics(out) if "loss" in r] == list(range(1, stopped[1] + 1))
    assert stopped[1] > stopped[0]


class _InfiniteGradientFrom(TrainerCallback):
    """From optimisation step `step` on, every gradient is finite but their norm is not (it overflows)."""

    def __init__(self, step):
        self.step, self.hooks = step, []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.step:
            p = next(p for p in model.parameters() if p.requires_grad)
            self.hooks.append(p.register_hook(lambda g: torch.full_like(g, 1e30)))


def test_a_nonfinite_gradient_norm_is_never_saved_and_names_its_step(data, tmp_path):
    """Checked where the Trainer reads numbers anyway (log lines, checkpoints, the end): logging every 100
    steps, the bad step 3 is caught by the checkpoint of step 4, which is not written."""
    model, tok = sbd.load(DEMO, probe=False)
    dataset = tokenize_records([json.loads(x) for x in data.read_text().splitlines()], tok, 32, tok.mask_token_id)
    out = tmp_path / "run"
    args = sbd_training_args(out, steps=8, batch_size=4, lr=1e-3, warmup_steps=1, save_steps=2, logging_steps=100)
    trainer = SBDTrainer(model, args, data_collator=SBDDataCollator(tok), train_dataset=dataset, processing_class=tok,
                         metrics_file=out / "metrics.jsonl", show_progress=False, callbacks=[_InfiniteGradientFrom(3)])
    with pytest.raises(SBDError, match=r"^the gradient norm became inf at step 3; stopped, nothing saved after it\. "
                                       r"Last good checkpoint: .*checkpoint-2 \(try a lower learning rate"):
        trainer.train()
    assert trainer.state.global_step == 4
    assert [p.name for p in ckpt.checkpoints(out)] == ["checkpoint-2"] and not (out / ckpt.STAGING).exists()
    saved, _ = sbd.load(out / "checkpoint-2", probe=False)
    assert all(torch.isfinite(p).all() for p in saved.parameters())


def test_an_infinite_gradient_norm_at_every_step_is_one_line_not_success(data, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--model", str(DEMO), "--data", str(data), "--out", str(out), "--adapter", "lora",
                 "--rank", "2", "--steps", "6", "--batch-size", "4", "--save-steps", "2", "--latent-weight", "1e30",
                 "--no-progress"])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("sbd: error: the gradient norm became inf at step 1;"), err
    assert "Last good checkpoint: none" in err[0] and "--latent-weight (now 1e+30)" in err[0], err
    assert "trained" not in captured.out
    assert ckpt.checkpoints(out) == [] and not (out / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("schedule, warmup, steps", [("cooldown", 10, 6), ("cosine", 6, 6)])
def test_a_schedule_that_cannot_decay_is_refused(data, tmp_path, capsys, schedule, warmup, steps):
    out = tmp_path / "run"
    code = main(["train", "--model", str(DEMO), "--data", str(data), "--out", str(out), "--schedule", schedule,
                 "--warmup-steps", str(warmup), "--steps", str(steps), "--batch-size", "4", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    for words in (f"--warmup-steps {warmup}", f"--steps {steps}", f"--schedule {schedule}",
                  f"use --warmup-steps {steps - 1} or less"):
        assert words in err[0], err
    assert not out.exists()


def _adapter_run(data, out, seed):
    assert main(["train", "--model", str(DEMO), "--data", str(data), "--out", str(out), "--adapter", "lora",
                 "--rank", "2", "--sampler-head", "--sampler-head-width", "16", "--steps", "3", "--batch-size", "4",
                 "--max-len", "32", "--warmup-steps", "1", "--logging-steps", "1", "--save-steps", "100",
                 "--seed", str(seed), "--no-progress"]) == 0
    metrics = [{k: v for k, v in r.items() if k not in TIMING} for r in _metrics(out)]
    weights = {**load_file(str(out / "adapter_model.safetensors")), **load_file(str(out / "sampler_head.safetensors"))}
    return metrics, weights


def test_the_seed_covers_the_adapter_and_head_initialisation(data, tmp_path):
    a_metrics, a = _adapter_run(data, tmp_path / "a", 3)
    b_metrics, b = _adapter_run(data, tmp_path / "b", 3)
    assert len(a_metrics) == 4 and a_metrics == b_metrics  # 3 steps and the summary, bit for bit
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c_metrics, c = _adapter_run(data, tmp_path / "c", 4)
    assert c_metrics != a_metrics and not all(torch.equal(a[k], c[k]) for k in a)
