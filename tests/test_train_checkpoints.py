"""Resume equivalence, Ctrl-C, atomic checkpoints, NaN stop and per-step block size of SBDTrainer."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from transformers import TrainerCallback

import sbd
from sbd.models import tiny
from sbd.errors import SBDError
from sbd.training import checkpoints as ckpt
from sbd.training.collator import SBDDataCollator
from sbd.training.data import tokenize_records
from sbd.training.trainer import SBDTrainer, sbd_training_args

TEXTS = [" ".join(str(i) for i in range(s, s + 7 + s % 5)) for s in range(24)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model"
    tiny.create(path, texts=TEXTS, vocab_size=200, hidden=32, layers=2, heads=4, kv_heads=2, context=64)
    return path


def _trainer(model_dir, out, steps=6, save_steps=100, callbacks=(), **kw):
    model, tok = sbd.load(model_dir, probe=False)
    data = tokenize_records([{"text": t} for t in TEXTS], tok, 48, tok.mask_token_id)
    args = sbd_training_args(out, steps=steps, batch_size=4, grad_accum=2, lr=3e-3, warmup_steps=2,
                             save_steps=save_steps, logging_steps=1, seed=5, **kw)
    return SBDTrainer(model, args, data_collator=SBDDataCollator(tok), train_dataset=data, processing_class=tok,
                      metrics_file=out / "metrics.jsonl", show_progress=False, callbacks=list(callbacks))


def _losses(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["ntp_loss"], r["matp_loss"]) for r in rows if "loss" in r}


class _At(TrainerCallback):
    def __init__(self, step, action):
        self.step, self.action = step, action

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.action()


def test_ctrl_c_then_resume_matches_uninterrupted_run(model_dir, tmp_path):
    full = _trainer(model_dir, tmp_path / "full")
    full.train()
    reference = _losses(tmp_path / "full")
    assert len(reference) == 6 and len({v[0] for v in reference.values()}) == 6

    out = tmp_path / "cut"
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under nohup / a background job
    first = _trainer(model_dir, out, callbacks=[_At(3, lambda: os.kill(os.getpid(), signal.SIGINT))])
    first.train()  # the SIGINT handler turns Ctrl-C into save + stop
    assert first.interrupted and first.state.global_step == 3
    assert ckpt.latest_checkpoint(out).name == "checkpoint-3"
    assert signal.getsignal(signal.SIGINT) is before  # handler restored

    second = _trainer(model_dir, out)
    second.train(resume_from_checkpoint=str(ckpt.latest_checkpoint(out)))
    resumed = _losses(out)
    assert sorted(resumed) == list(range(1, 7))  # log lines of steps 1-3 kept, 4-6 from the resumed run
    for step in range(1, 7):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-6, abs=1e-7), step
    for a, b in zip(full.model.parameters(), second.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_crash_mid_save_keeps_previous_checkpoint(model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    trainer = _trainer(model_dir, out, save_steps=2)
    real = trainer._save_optimizer_and_scheduler

    def crash(output_dir):
        if trainer.state.global_step == 4:
            raise OSError("disk full (simulated)")
        real(output_dir)

    monkeypatch.setattr(trainer, "_save_optimizer_and_scheduler", crash)
    with pytest.raises(SBDError, match="simulated"):  # one line naming the path; the old checkpoint stays
        trainer.train()
    assert [p.name for p in ckpt.checkpoints(out)] == ["checkpoint-2"]
    assert (out / ckpt.STAGING / "checkpoint-4" / "model.safetensors").exists()  # the half-written one
    latest = ckpt.latest_checkpoint(out)
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= set(os.listdir(latest))
    model, _ = sbd.load(latest)  # complete and loadable
    assert model.config.sbd_mask_token_id is not None

    resumed = _trainer(model_dir, out, save_steps=2)
    resumed.train(resume_from_checkpoint=str(latest))
    assert resumed.state.global_step == 6
    assert [p.name for p in ckpt.checkpoints(out)] == ["checkpoint-4", "checkpoint-6"]  # save_total_limit=2
    assert not (out / ckpt.STAGING).exists()


def test_nan_loss_stops_with_clear_error(model_dir, tmp_path):
    out = tmp_path / "nan"
    holder = {}

    def poison():
        with torch.no_grad():
            holder["t"].model.get_output_embeddings().weight.fill_(float("nan"))

    trainer = _trainer(model_dir, out, save_steps=2, callbacks=[_At(3, poison)])
    holder["t"] = trainer
    with pytest.raises(SBDError, match=r"loss became nan at step 4.*checkpoint-2"):
        trainer.train()
    assert [p.name for p in ckpt.checkpoints(out)] == ["checkpoint-2"]
    model, _ = sbd.load(ckpt.latest_checkpoint(out))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_block_size_is_drawn_per_optimisation_step(model_dir, tmp_path):
    trainer = _trainer(model_dir, tmp_path / "k")
    ks = [trainer.block_size_for_step(s) for s in range(400)]
    assert set(ks) == set(range(2, 17))
    assert ks == [trainer.block_size_for_step(s) for s in range(400)]  # a function of (seed, step)
    seen = []
    real = trainer.build_batch

    def spy(clean, step, micro=0):
        batch = real(clean, step, micro)
        n = batch["num_clean"]
        seen.append((step, int(batch["attention_mask"][0, 0, n, n:].sum())))
        return batch

    trainer.build_batch = spy
    trainer.args.max_steps = 4
    trainer.train()
    by_step = {}
    for step, visible in seen:
        by_step.setdefault(step, []).append(visible)
    assert sorted(by_step) == [0, 1, 2, 3] and all(len(v) == 2 for v in by_step.values())  # 2 micro-batches
    for step, visible in by_step.items():  # both micro-batches of a step use that step's k
        k = trainer.block_size_for_step(step)  # every sequence has >= 8 tokens, so blocks of <= 8 are whole
        assert all(v == k for v in visible) if k <= 8 else all(v <= k for v in visible), (step, k, visible)
