"""Cheaper drafting-adapter steps (issue 27, item 2), each exact for what it claims:

- `noisy_blocks`: the noisy copy holds a few randomly drawn blocks; each is the same block, with the
  same labels, positions and view of the clean prefix, as in the full layout;
- the two-pass forward cuts the clean half after the last position any noisy query or KL target needs
  and still gives the loss and gradients of the plain doubled forward;
- `grad_from_layer`: with the adapter frozen below layer L, no autograd below L gives the same
  gradients for what still trains;
- `position_weights`: the weighted masked loss, and a whole `sbd train` run with every option, where
  the frozen part of the adapter keeps its values.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import attach_random_adapter, trainable_adapted
from safetensors.torch import load_file

from sbd.drafters import adapter as adapters
from sbd.cli import main
from sbd.errors import SBDError
from sbd.models import tiny
from sbd.training.adapter_forward import adapter_logits, clean_span, freeze_below, grad_from_layer, plain_adapter_logits
from sbd.training.collator import IGNORE, SBDDataCollator
from sbd.training.loss import position_weights, sbd_loss

LENGTHS = ((40, 5), (29, 3), (9, 2))  # (sequence length, prompt length): the last has fewer blocks than asked


def _collator(tokenizer, k, noisy_blocks=None, eos=None):
    return SBDDataCollator(tokenizer, mask_token_id=tokenizer.mask_token_id, block_size=k, align_to_completion=True,
                           noisy_blocks=noisy_blocks, eos_token_id=eos, last_block="eos" if eos is not None else "drop")


def _clean(c, eos=None):
    feats = [{"input_ids": list(range(5, 5 + n - 1)) + [eos if eos is not None else 4 + n], "prompt_length": p}
             for n, p in LENGTHS]
    return c.pad(feats)


@pytest.mark.parametrize("k,w", [(4, 2), (3, 3), (5, 1)])
def test_noisy_blocks_are_the_full_layouts_blocks(tokenizer, k, w):
    eos = tokenizer.eos_token_id
    full_c, win_c = _collator(tokenizer, k, eos=eos), _collator(tokenizer, k, w, eos=eos)
    clean = _clean(full_c, eos)
    g = torch.Generator().manual_seed(k * 10 + w)
    m_full = full_c.noisy_length(clean, k)
    ones = torch.zeros(3, m_full)  # u = 0 < eta = 1: every position masked, so both layouts are deterministic
    full = full_c.corrupt(clean, k, torch.ones(3), ones)
    windows = win_c.draw_windows(3, win_c.block_count(clean, k), g)
    win = win_c.corrupt(clean, k, torch.ones(3), ones, windows=windows)
    offset, real, _ = win_c.layout(clean, k, windows)
    n = full["num_clean"]
    assert win["num_clean"] == n and win["input_ids"].shape[1] == n + min(w, -(-m_full // k)) * k
    src = win_c.sources(clean, k, windows)
    for b in range(3):
        blocks = -(-int(full_c.noisy_lengths(clean, k)[b]) // k)
        chosen = sorted({int(o) // k for o, r in zip(offset[b], real[b]) if r})
        assert len(chosen) == min(w, blocks) and all(0 <= x < blocks for x in chosen)
        for j in range(offset.shape[1]):
            if not real[b, j]:
                assert win["labels"][b, n + j] == IGNORE and not win["attention_mask"][b, 0, n + j, :n].any()
                continue
            o = int(offset[b, j])
            for key in ("input_ids", "position_ids", "labels"):
                assert win[key][b, n + j] == full[key][b, n + o], key
            # the same view of the clean prefix (the real tokens before the block's place in x), and of its
            # own block only
            before = clean["prompt_lengths"][b] + o - o % k
            expect = (torch.arange(n) < before) & (torch.arange(n) < clean["lengths"][b])
            assert torch.equal(win["attention_mask"][b, 0, n + j, :n], expect)
            assert torch.equal(full["attention_mask"][b, 0, n + o, :n], expect)
            same_block = (torch.arange(offset.shape[1]) // k == j // k) & real[b]
            assert torch.equal(win["attention_mask"][b, 0, n + j, n:], same_block)
            assert src[b, j] == (o + clean["prompt_lengths"][b] if o + clean["prompt_lengths"][b] < clean["lengths"][b]
                                 else -1)


def test_noisy_blocks_draw_every_block(tokenizer):
    c = _collator(tokenizer, 4, 2)
    clean = _clean(c)
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(200):
        offset, real, _ = c.layout(clean, 4, c.draw_windows(3, c.block_count(clean, 4), g))
        seen |= {int(o) // 4 for o, r in zip(offset[0], real[0]) if r}
    assert seen == set(range(-(-int(c.noisy_lengths(clean, 4)[0]) // 4)))  # 9 blocks of the first row


def test_noisy_blocks_refusals(tokenizer):
    with pytest.raises(SBDError, match="noisy_blocks"):
        _collator(tokenizer, 4, 0)
    c = _collator(tokenizer, 4, 2)
    clean = _clean(c)
    with pytest.raises(ValueError, match="window uniforms"):
        c.corrupt(clean, 4, torch.ones(3), torch.zeros(3, 64))


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_two_pass_forward_with_noisy_blocks_equals_the_doubled_forward(arch, tokenizer):
    model, ad = trainable_adapted(arch, tokenizer, seed=5)
    model.train()
    c = _collator(tokenizer, 4, 2)
    clean = _clean(c)
    g = torch.Generator().manual_seed(2)
    windows = torch.tensor([[0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999],   # blocks 0 and 1 of row 0:
                            [0.9, 0.1, 0.0, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999],   # the clean half can stop early
                            [0.3, 0.2, 0.1, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999]])
    u = torch.rand(3, c.noisy_length(clean, 4), generator=g)
    batch = c.corrupt(clean, 4, torch.full((3,), 0.7), u, windows=windows)
    n, labels = batch.pop("num_clean"), batch.pop("labels")
    labels[:, :n] = IGNORE
    source = c.sources(clean, 4, windows)
    keep = labels[:, n:] != IGNORE
    assert clean_span(batch["attention_mask"], n, source[keep]) < n  # the saving this test is about happens
    targets = labels[labels != IGNORE]
    out = adapter_logits(model, batch, labels, n, source)
    ref = plain_adapter_logits(model, batch, labels, n)
    loss = torch.nn.functional.cross_entropy(out.logits, targets)
    ref_loss = torch.nn.functional.cross_entropy(ref, targets)
    grads = torch.autograd.grad(loss, list(ad.parameters()))
    ref_grads = torch.autograd.grad(ref_loss, list(ad.parameters()))
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * max(1.0, abs(ref_loss.item()))
    for a, b in zip(grads, ref_grads):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max())
    # the KL's frozen next-token logits for each target: those of the full clean half
    with torch.no_grad(), adapters.gated(model, None):
        full = model(input_ids=batch["input_ids"][:, :n]).logits
    rows, src = keep.nonzero()[:, 0], source[keep]
    assert torch.allclose(out.base_logits, full[rows, (src - 1).clamp_min(0)], atol=1e-4)


def test_no_autograd_below_a_layer_gives_the_same_gradients(tokenizer):
    cfg = tiny.tiny_config("llama", vocab_size=len(tokenizer), hidden=64, layers=3, heads=4, kv_heads=2, context=128)
    model = tiny.random_model(cfg, seed=7)
    model.config.sbd_mask_token_id = tokenizer.mask_token_id
    model.requires_grad_(False)
    ad = attach_random_adapter(model, scale=0.1)
    model.train()
    c = _collator(tokenizer, 4)
    clean = _clean(c)
    u = torch.rand(3, c.noisy_length(clean, 4), generator=torch.Generator().manual_seed(3))
    batch = c.corrupt(clean, 4, torch.full((3,), 0.7), u)
    n, labels = batch.pop("num_clean"), batch.pop("labels")
    labels[:, :n] = IGNORE
    targets = labels[labels != IGNORE]
    trains = freeze_below(model, 2)
    params = [p for p in ad.parameters() if p.requires_grad]
    assert 0 < trains == sum(p.numel() for p in params) < sum(p.numel() for p in ad.parameters())
    assert not ad.mask_embedding.requires_grad
    ref = torch.autograd.grad(torch.nn.functional.cross_entropy(adapter_logits(model, batch, labels, n).logits, targets),
                              params)
    logits = adapter_logits(model, batch, labels, n, grad_layer=2).logits
    got = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, targets), params)
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, atol=1e-6) and b.abs().max() > 0
    # and autograd is really off below layer 2: nothing there is saved for backward
    seen = []
    hook = model.model.layers[1].register_forward_hook(lambda m, a, o: seen.append(torch.is_grad_enabled()))
    with adapters.gated(model, 0), grad_from_layer(model, 2):
        model(input_ids=batch["input_ids"][:, n:])
    hook.remove()
    assert seen == [False] and torch.is_grad_enabled()
    with pytest.raises(SBDError, match="train-layers-from"):
        freeze_below(model, 3)


def test_position_weights_and_the_weighted_loss():
    offsets = torch.tensor([0, 1, 2, 3, 0, 1])
    assert position_weights(offsets, 0.5).tolist() == [1.0, 1.0, 0.5, 0.25, 1.0, 1.0]
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    labels = torch.full((1, 10), IGNORE)
    labels[0, 4:] = torch.tensor([1, 2, 3, 4, 5, 6])
    w = position_weights(offsets, 0.5)
    parts = sbd_loss(logits, labels, num_clean=4, weights=w)
    ce = torch.nn.functional.cross_entropy(logits, labels[0, 4:], reduction="none")
    assert torch.allclose(parts.loss, (ce * w).sum() / w.sum())
    assert torch.allclose(parts.matp_sum, ce.sum())  # logged: plain cross-entropy


COUNTS = [" ".join(str(i) for i in range(s, s + 12)) for s in range(40)]


def test_train_run_with_every_cheap_option(tmp_path):
    model, _ = tiny.create(tmp_path / "model", texts=COUNTS + tiny.SAMPLE_TEXT, vocab_size=260, hidden=48, layers=3,
                           heads=4, kv_heads=2, context=128)
    with open(tmp_path / "toy.jsonl", "w") as f:
        for s in range(40):
            f.write(json.dumps({"prompt": f"count {s}:", "completion": " " + COUNTS[s]}) + "\n")
    common = ["--data", str(tmp_path / "toy.jsonl"), "--adapter", "lora", "--rank", "4", "--batch-size", "8",
              "--lr", "1e-2", "--warmup-steps", "2", "--logging-steps", "5", "--save-steps", "10", "--block-size", "4",
              "--align-to-completion", "--no-progress"]
    assert main(["train", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "a"), "--steps", "10",
                 *common]) == 0
    start = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    assert main(["train", "--model", str(tmp_path / "a"), "--out", str(tmp_path / "b"), "--steps", "20",
                 "--noisy-blocks", "2", "--train-layers-from", "2", "--position-decay", "0.7", "--group-by-length",
                 "--kl-weight", "0.5", *common]) == 0
    end = load_file(str(tmp_path / "b" / "adapter_model.safetensors"))
    lower = [k for k in start if ".layers.0." in k or ".layers.1." in k or "mask" in k]
    upper = [k for k in start if ".layers.2." in k]
    assert lower and upper
    assert all(torch.equal(start[k], end[k]) for k in lower)
    assert any(not torch.equal(start[k], end[k]) for k in upper)
    logs = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["matp_loss"])) for r in logs if "matp_loss" in r)


def test_cheap_options_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n')
    base = ["train", "--model", str(tmp_path), "--data", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "o")]
    for extra, words in ((["--train-layers-from", "2"], "drafting-adapter runs only (--adapter)"),
                         (["--adapter", "lora", "--position-decay", "1.5"], "--position-decay"),
                         (["--noisy-blocks", "0"], "--noisy-blocks")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
