"""Data-parallel training through torchrun + Trainer (gloo on CPU): 2 processes with batch B each must
end with identical parameters on both ranks and match a 1-process run with batch 2B (same global batch)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from sbd.models import tiny

TEXTS = [" ".join(str(i) for i in range(s, s + 6 + s % 4)) for s in range(32)]

WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import sbd
    from sbd.training.collator import SBDDataCollator
    from sbd.training.data import tokenize_records
    from sbd.training.trainer import SBDTrainer, sbd_training_args

    model_dir, out, batch, texts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    torch.set_num_threads(1)
    model, tok = sbd.load(model_dir, probe=False)
    data = tokenize_records([{"text": t} for t in texts], tok, 48, tok.mask_token_id)
    args = sbd_training_args(out, steps=4, batch_size=batch, lr=3e-3, warmup_steps=1, save_steps=100,
                             logging_steps=1, seed=11)
    trainer = SBDTrainer(model, args, data_collator=SBDDataCollator(tok), train_dataset=data,
                         processing_class=tok, metrics_file=os.path.join(out, "metrics.jsonl"), show_progress=False)
    trainer.train()
    rank = int(os.environ.get("RANK", 0))
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, os.path.join(out, f"params{rank}.pt"))
    if rank == 0:
        with open(os.path.join(out, "world.json"), "w") as f:
            json.dump({"world_size": trainer.args.world_size}, f)
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(out):
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [(r["loss"], r["ntp_loss"], r["matp_loss"]) for r in rows if "loss" in r]


def test_two_process_ddp_matches_one_process(tmp_path):
    model_dir = tmp_path / "model"
    tiny.create(model_dir, texts=TEXTS, vocab_size=200, hidden=32, layers=2, heads=4, kv_heads=2, context=64)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    texts = json.dumps(TEXTS)
    ddp = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), str(script), str(model_dir), str(ddp), "2", texts]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    single = tmp_path / "single"
    run = subprocess.run([sys.executable, str(script), str(model_dir), str(single), "4", texts], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]

    assert json.load(open(ddp / "world.json"))["world_size"] == 2
    p0, p1 = torch.load(ddp / "params0.pt"), torch.load(ddp / "params1.pt")
    assert all(torch.equal(p0[k], p1[k]) for k in p0), "ranks ended with different parameters"
    one = torch.load(single / "params0.pt")
    from safetensors.torch import load_file

    initial = load_file(model_dir / "model.safetensors")
    assert max((p0[k] - initial[k]).abs().max().item() for k in initial) > 1e-3, "training did not move weights"
    assert max((p0[k] - one[k]).abs().max().item() for k in p0) < 1e-5
    l_ddp, l_one = _losses(ddp), _losses(single)
    assert len(l_ddp) == len(l_one) == 4
    for a, b in zip(l_ddp, l_one):
        assert a == pytest.approx(b, rel=1e-5)
