"""Two training levers against the drafter's plateau (issue 45, item 4):

- the latent-consistency term (`--latent-weight`): the two-pass forward's mask hidden states and the
  frozen model's "same-token" hidden states are those of the plain doubled forward, and the term's
  gradients match it; the trainer adds exactly weight × term / targets to the loss and logs it;
- the cool-down schedule (`--schedule cooldown`): after the warmup the rate is lr · (1 − sqrt(progress)),
  reaching 0 at the last step;
- bad values are refused in one line.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import _model, attach_random_adapter, trainable_adapted

from sbd.drafters import adapter as adapters
from sbd.cli import main
from sbd.errors import SBDError
from sbd.models import tiny
from sbd.drafters.sampler_head import capture_output_input
from sbd.training.adapter_forward import adapter_logits, latent_sum
from sbd.training.collator import IGNORE, SBDDataCollator
from sbd.training.trainer import SBDTrainer, sbd_training_args


def _doubled(tokenizer, block_size=4):
    c = SBDDataCollator(tokenizer, mask_token_id=tokenizer.mask_token_id, block_size=block_size,
                        align_to_completion=True, mask_rate=1.0)
    feats = [{"input_ids": list(range(7, 7 + n)), "prompt_length": p, "index": i}
             for i, (n, p) in enumerate(((18, 5), (12, 3), (9, 2)))]
    clean = c.pad(feats)
    batch = c.corrupt(clean, block_size, torch.ones(3), torch.zeros(3, c.noisy_length(clean, block_size)))
    n = batch.pop("num_clean")
    labels = batch.pop("labels")
    labels[:, :n] = IGNORE
    return batch, labels, n, c.sources(clean, block_size, None)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_latent_term_reads_the_doubled_forwards_hidden_states(arch, tokenizer):
    model, ad = trainable_adapted(arch, tokenizer, seed=3)
    batch, labels, n, source = _doubled(tokenizer)
    keep = labels[:, n:] != IGNORE
    try:
        out = adapter_logits(model, batch, labels, n, source, with_hidden=True, base_hidden=True)
        fast = latent_sum(out.hidden, out.base_hidden, out.kl_valid)
        alone = adapter_logits(model, batch, labels, n, source, with_hidden=True, base_hidden=True, base_logits=False)
        assert alone.base_logits is None and torch.equal(alone.base_hidden, out.base_hidden)
        (g_fast,) = torch.autograd.grad(fast, [next(p for p in ad.parameters() if p.requires_grad)])
        # the reference: one doubled forward, gate at n, the output layer's input at every position
        with adapters.gated(model, n), capture_output_input(model) as box:
            model(**batch, use_cache=False)
        full = box[0]
        rows = keep.nonzero()[:, 0]
        src = source[keep]
        mask_h = full[:, n:][keep]
        base_h = full[rows, (src - 1).clamp_min(0)].detach()
        valid = src >= 1
        ref = (mask_h[valid] - base_h[valid]).pow(2).mean(dim=-1).sum()
        (g_ref,) = torch.autograd.grad(ref, [next(p for p in ad.parameters() if p.requires_grad)])
    finally:
        adapters.detach(model)
    assert bool(valid.any()) and torch.equal(out.kl_valid, valid)
    assert torch.allclose(out.base_hidden, base_h, atol=1e-5)
    assert abs(fast.item() - ref.item()) <= 1e-5 * max(1.0, ref.item()) and ref.item() > 0
    assert (g_fast - g_ref).abs().max() <= 1e-5 * max(1.0, g_ref.abs().max()) and g_ref.abs().max() > 0


def test_latent_sum_is_zero_where_the_states_agree_and_ignores_invalid_rows():
    h = torch.randn(4, 8)
    assert latent_sum(h, h.clone(), torch.ones(4, dtype=torch.bool)).item() == 0.0
    far = h + 2.0
    assert latent_sum(h, far, torch.tensor([True, False, False, False])).item() == pytest.approx(4.0)
    assert latent_sum(h, far, torch.zeros(4, dtype=torch.bool)).item() == 0.0


def _data(tokenizer, n=8, length=14):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(3, 300, (length,), generator=g, device="cpu").tolist()
             + [tokenizer.eos_token_id],
             "prompt_length": 3, "index": i} for i in range(n)]


def test_trainer_adds_weight_times_the_latent_term(tokenizer, tmp_path):
    model = _model("llama", seed=3)
    ad = attach_random_adapter(model, seed=4, scale=0.1)
    model.requires_grad_(False)
    ad.requires_grad_(True)
    data = _data(tokenizer)
    collator = SBDDataCollator(tokenizer, mask_token_id=model.config.sbd_mask_token_id, block_size=4,
                               align_to_completion=True)
    losses = {}
    try:
        for w in (0.0, 2.5):
            args = sbd_training_args(tmp_path / str(w), steps=1, batch_size=4, warmup_steps=0, save_steps=100)
            t = SBDTrainer(model, args, data_collator=collator, train_dataset=data, processing_class=tokenizer,
                           mode="adapter", kl_weight=1.0, latent_weight=w, show_progress=False)
            batch = t.build_batch(collator.pad(data[:4]), step=0)
            targets = (batch["labels"] != IGNORE).sum()
            with torch.no_grad():
                losses[w] = t.compute_loss(model, dict(batch)).item()
                if w:
                    out = adapter_logits(model, batch, batch["labels"], batch["num_clean"],
                                         batch["source_positions"], with_hidden=True, base_hidden=True)
                    term = latent_sum(out.hidden, out.base_hidden, out.kl_valid).item()
            logged = t._stats[-1].item()
    finally:
        adapters.detach(model)
    assert term > 0 and logged == pytest.approx(term, rel=1e-5)
    assert losses[2.5] - losses[0.0] == pytest.approx(2.5 * term / targets.item(), rel=1e-4)


def test_cooldown_schedule_falls_as_one_minus_sqrt_to_zero(tokenizer, tmp_path):
    model = _model("llama", seed=3)
    ad = attach_random_adapter(model, seed=4, scale=0.1)
    model.requires_grad_(False)
    ad.requires_grad_(True)
    steps, warmup, lr = 10, 2, 1e-3
    args = sbd_training_args(tmp_path, steps=steps, batch_size=4, lr=lr, warmup_steps=warmup, save_steps=100,
                             schedule="cooldown")
    t = SBDTrainer(model, args, train_dataset=_data(tokenizer), processing_class=tokenizer, mode="adapter",
                   show_progress=False)
    try:
        t.create_optimizer_and_scheduler(num_training_steps=steps)
        rates = []
        for _ in range(steps + 1):
            rates.append(t.lr_scheduler.get_last_lr()[0])
            t.optimizer.step()
            t.lr_scheduler.step()
    finally:
        adapters.detach(model)
    expected = [lr * s / warmup for s in range(warmup)] + [
        lr * (1 - math.sqrt((s - warmup) / (steps - warmup))) for s in range(warmup, steps + 1)]
    assert rates == pytest.approx(expected, abs=1e-9)
    assert rates[-1] == pytest.approx(0.0, abs=1e-12)


def test_bad_lever_values_are_refused_in_one_line(tmp_path, capsys, tokenizer):
    with pytest.raises(SBDError, match="schedule"):
        sbd_training_args(tmp_path, steps=4, schedule="linear")
    model = _model("llama", seed=3)
    attach_random_adapter(model, seed=4)
    try:
        with pytest.raises(SBDError, match="latent_weight"):
            SBDTrainer(model, sbd_training_args(tmp_path, steps=1), train_dataset=_data(tokenizer),
                       processing_class=tokenizer, mode="adapter", latent_weight=-1.0, show_progress=False)
    finally:
        adapters.detach(model)
    tiny.create(tmp_path / "model", texts=tiny.SAMPLE_TEXT, vocab_size=260, hidden=32, layers=2, heads=4, kv_heads=2,
                context=64)
    (tmp_path / "d.jsonl").write_text('{"prompt": "count 1:", "completion": " 2 3 4 5 6"}\n' * 4)
    argv = ["train", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "d.jsonl"), "--out",
            str(tmp_path / "out"), "--steps", "1", "--no-progress"]
    for bad, expect in ((["--latent-weight", "1"], "--latent-weight applies to drafting-adapter runs only"),
                        (["--adapter", "lora", "--latent-weight", "-0.5"], "--latent-weight must be"),
                        (["--adapter", "lora", "--sampler-head-only", "--latent-weight", "1"], "trains no adapter")):
        assert main(argv + bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expect in err[0], err
    with pytest.raises(SystemExit) as e:  # argparse's own choice check
        main(argv + ["--schedule", "linear"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
