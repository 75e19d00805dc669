"""bf16 autocast for training (`sbd train --bf16`): the step really computes in bfloat16, its loss and
gradients track float32's on the same batch, and where the CPU has no bfloat16 path it is refused in
one line rather than run many times slower."""

from __future__ import annotations

import pytest
import torch
from conftest import _model, attach_random_adapter

from sbd.drafters import adapter as adapters
from sbd.cli import main
from sbd.models import tiny
from sbd.training import trainer as trainer_module
from sbd.training.collator import SBDDataCollator
from sbd.training.trainer import SBDTrainer, cpu_computes_bf16, sbd_training_args


def _data(tokenizer, n=8, length=14):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(3, 300, (length,), generator=g, device="cpu").tolist()
             + [tokenizer.eos_token_id],
             "prompt_length": 3, "index": i} for i in range(n)]


@pytest.mark.skipif(not cpu_computes_bf16(), reason="this CPU has no oneDNN bfloat16 path (AVX-512 or AMX)")
def test_bf16_step_computes_in_bfloat16_and_tracks_float32(tokenizer, tmp_path):
    model = _model("llama", seed=3)
    ad = attach_random_adapter(model, seed=4, scale=0.1)
    model.requires_grad_(False)
    ad.requires_grad_(True)
    model.train()
    params = [p for p in ad.parameters() if p.requires_grad]
    data = _data(tokenizer)
    collator = SBDDataCollator(tokenizer, mask_token_id=model.config.sbd_mask_token_id, block_size=4,
                               align_to_completion=True)
    seen = []
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, a, o: seen.append(o.dtype))
    try:
        losses, grads = {}, {}
        for bf16 in (False, True):
            args = sbd_training_args(tmp_path / str(bf16), steps=1, batch_size=4, warmup_steps=0, save_steps=100)
            t = SBDTrainer(model, args, data_collator=collator, train_dataset=data, processing_class=tokenizer,
                           mode="adapter", kl_weight=1.0, bf16=bf16, show_progress=False)
            batch = t.build_batch(collator.pad(data[:4]), step=0)
            seen.clear()
            loss = t.compute_loss(model, batch)
            assert set(seen) == {torch.bfloat16 if bf16 else torch.float32}, seen
            assert loss.dtype == torch.float32
            losses[bf16] = loss.item()
            grads[bf16] = torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])
    finally:
        hook.remove()
        adapters.detach(model)
    assert losses[True] == pytest.approx(losses[False], rel=3e-2)
    cosine = torch.nn.functional.cosine_similarity(grads[True], grads[False], dim=0).item()
    assert 0.98 < cosine <= 1.0 + 1e-6 and grads[False].abs().max() > 0


def test_bf16_refused_in_one_line_where_the_cpu_has_no_bfloat16(tmp_path, monkeypatch, capsys):
    tiny.create(tmp_path / "model", texts=tiny.SAMPLE_TEXT, vocab_size=260, hidden=32, layers=2, heads=4, kv_heads=2,
                context=64)
    (tmp_path / "d.jsonl").write_text('{"prompt": "count 1:", "completion": " 2 3 4 5 6"}\n' * 4)
    monkeypatch.setattr(trainer_module, "cpu_computes_bf16", lambda: False)
    argv = ["train", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "d.jsonl"), "--out",
            str(tmp_path / "o"), "--adapter", "lora", "--steps", "1", "--bf16", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bf16" in err[0] and "no bfloat16 path" in err[0], err
