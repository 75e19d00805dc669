"""The cheaper training forward (sbd/training/attention.py) computes the same loss and gradients.

Split attention (causal kernel for the clean half, dense mask rows for the noisy half only) and
logits at labelled positions only must give the plain forward's loss and gradients up to fp32
rounding, on every supported family, with padding, prompts, both layouts, and in both modes.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface

from sbd.models import tiny
from sbd.training import attention
from sbd.training.collator import SBDDataCollator
from sbd.training.loss import sbd_loss

MASK_ID = 2


def _model(arch):
    cfg = tiny.tiny_config(arch, vocab_size=97, hidden=32, layers=2, heads=4, kv_heads=2, context=128)
    model = tiny.random_model(cfg, seed=1)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(5)
    return model


def _batch(mode, aligned, seed=3):
    collator = SBDDataCollator(mask_token_id=MASK_ID, eos_token_id=0, align_to_completion=aligned)
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, 97, (n,), generator=g).tolist() for n in (19, 11, 16)]
    clean = collator.pad([{"input_ids": s, "prompt_length": p} for s, p in zip(seqs, [5, 3, 0])])
    if mode == "ntp":
        batch = collator.causal(clean)
    else:
        eta, u = collator.draw_noise(3, collator.noisy_length(clean), g)
        batch = collator.corrupt(clean, 4, eta, u)
    return batch.pop("labels"), batch.pop("num_clean"), batch


def _loss_and_grads(model, batch, labels, num_clean, mode, fast):
    model.zero_grad(set_to_none=True)
    logits = attention.training_logits(model, batch, labels, num_clean if mode == "sbd" else None,
                                       split=fast, labelled_only=fast)
    parts = sbd_loss(logits, labels, num_clean)
    parts.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return parts, grads, logits


@pytest.mark.parametrize("arch", tiny.ARCHS)
@pytest.mark.parametrize("aligned", [False, True], ids=["paper", "aligned"])
@pytest.mark.parametrize("mode", ["sbd", "ntp"])
def test_fast_forward_has_the_plain_loss_and_gradients(arch, aligned, mode, monkeypatch):
    model = _model(arch)
    labels, num_clean, batch = _batch(mode, aligned)
    plain, plain_grads, plain_logits = _loss_and_grads(model, batch, labels, num_clean, mode, fast=False)

    calls = []
    split = attention._split_sdpa

    def counting(module, query, *args, **kwargs):
        calls.append(kwargs.get(attention.NUM_CLEAN_KWARG))
        return split(module, query, *args, **kwargs)

    attention.register()
    monkeypatch.setitem(AttentionInterface._global_mapping, attention.SPLIT_ATTENTION, counting)
    fast, fast_grads, fast_logits = _loss_and_grads(model, batch, labels, num_clean, mode, fast=True)

    valid = labels != -100
    assert fast_logits.shape == (int(valid.sum()), 97)           # only the labelled rows were computed
    assert torch.allclose(fast_logits, plain_logits[valid], atol=1e-5, rtol=1e-5)
    if mode == "sbd":  # the split attention really ran, in every layer, with the clean length
        assert calls == [num_clean] * model.config.num_hidden_layers
    else:
        assert calls == []
    assert model.config._attn_implementation == "sdpa"          # restored after the forward
    assert fast.loss.item() == pytest.approx(plain.loss.item(), rel=1e-6, abs=1e-6)
    for name in ("ntp_sum", "ntp_count", "matp_sum", "matp_count"):
        assert getattr(fast, name).item() == pytest.approx(getattr(plain, name).item(), rel=1e-6, abs=1e-6)
    assert fast_grads.keys() == plain_grads.keys()
    for name, g in plain_grads.items():
        err = (fast_grads[name] - g).abs().max().item()
        assert err <= 1e-5 * max(1.0, g.abs().max().item()), f"{arch} {mode}: gradient of {name} differs by {err}"


def test_split_attention_falls_back_outside_sbd_calls():
    """Without the clean length (or on an NTP batch) the split function is plain SDPA."""
    model = _model("llama")
    labels, num_clean, batch = _batch("sbd", False)
    with torch.no_grad():
        ref = model(**batch).logits
        with attention.split_attention(model) as active:
            assert active
            assert model.config._attn_implementation == attention.SPLIT_ATTENTION
            same = model(**batch).logits                     # no sbd_num_clean: plain SDPA
    assert torch.equal(same, ref)
    assert model.config._attn_implementation == "sdpa"


def test_labelled_logits_refuse_a_model_without_logits_to_keep():
    class NoKeep(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, **kwargs):
            return self.inner(**kwargs)

    model = NoKeep(_model("qwen2"))
    assert not attention.supports_labelled_logits(model)
    labels, num_clean, batch = _batch("sbd", False)
    logits = attention.training_logits(model, batch, labels, num_clean)
    assert logits.shape == labels.shape + (97,)                  # full logits: the explicit fallback


def test_modeling_code_without_2d_logits_to_keep_gets_full_logits():
    """transformers 5.17's Llama takes `logits_to_keep` but indexes `hidden_states[:, keep, :]` (an int or
    1-D positions only): seen on a GPU machine as an IndexError deep inside the model. A model class whose
    module lacks the slicing helper gets full logits, and the same loss terms."""
    labels, num_clean, batch = _batch("sbd", False)
    model = _model("llama")
    with torch.no_grad():
        fast = attention.training_logits(model, batch, labels, num_clean)
        model.__class__ = type("OlderLlama", (type(model),), {"__module__": "older_transformers_modeling"})
        assert not attention.supports_labelled_logits(model)
        full = attention.training_logits(model, batch, labels, num_clean)
    assert full.shape == labels.shape + (fast.shape[-1],)
    torch.testing.assert_close(full[labels != -100], fast)
