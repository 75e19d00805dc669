"""SPEC §2 consistency: the training forward over [x | x̂] computes exactly what decoding computes.

Noisy block b of the training forward must equal the inference call f(x_<bk ; x̂_block) (a causal
prefix plus one bidirectional block, with and without a KV cache), and the clean half must equal a
plain causal forward — on every supported family, with padding in the batch, fp32, <= 1e-4.
"""

from __future__ import annotations

import pytest
import torch

from sbd.models import tiny
from sbd.decoding.cache import slab_cache
from sbd.masks import inference_mask, training_mask
from sbd.models.cache_arg import with_cache as cache_kwargs
from sbd.training.collator import SBDDataCollator

TOL = 1e-4
MASK_ID, EOS_ID = 2, 0  # tiny tokenizers: 0 EOS, 1 pad, 2 mask


def _collator(**kw):
    return SBDDataCollator(mask_token_id=MASK_ID, eos_token_id=EOS_ID, **kw)


def _model(arch):
    cfg = tiny.tiny_config(arch, vocab_size=97, hidden=32, layers=2, heads=4, kv_heads=2, context=128)
    model = tiny.random_model(cfg, seed=1)
    with torch.no_grad():  # larger logits than the default init, so that a wrong mask shows
        model.get_output_embeddings().weight.mul_(20)
    return model


def _batch(collator, seqs, prompts, k, eta, seed):
    clean = collator.pad([{"input_ids": s, "prompt_length": p} for s, p in zip(seqs, prompts)])
    g = torch.Generator().manual_seed(seed)
    _, u = collator.draw_noise(len(seqs), collator.noisy_length(clean), g)
    return clean, collator.corrupt(clean, k, torch.full((len(seqs),), eta), u)


def _infer_block(model, prefix, block, with_cache):
    """Logits of the block under the inference mask: prefix causal, block bidirectional (SPEC §3)."""
    n, k = len(prefix), len(block)
    ids = torch.tensor([prefix + block])
    pad = torch.zeros(1, dtype=torch.long)
    if not with_cache or n == 0:
        mask = inference_mask(pad, 0, n, k)
        return model(input_ids=ids, position_ids=torch.arange(n + k)[None], attention_mask=mask).logits[0, n:]
    cache = slab_cache(model, n + k)
    model(input_ids=ids[:, :n], position_ids=torch.arange(n)[None], attention_mask=inference_mask(pad, 0, n, 0),
          **cache_kwargs(model, cache), use_cache=True)
    out = model(input_ids=ids[:, n:], position_ids=torch.arange(n, n + k)[None],
                attention_mask=inference_mask(pad, n, 0, k), **cache_kwargs(model, cache), use_cache=True)
    return out.logits[0]


@pytest.mark.parametrize("arch", tiny.ARCHS)
@pytest.mark.parametrize("aligned", [False, True], ids=["paper", "aligned"])
@pytest.mark.parametrize("last_block", ["eos", "drop"])
@torch.no_grad()
def test_training_forward_equals_inference_calls(arch, aligned, last_block):
    """Every complete noisy block, the EOS-padded last block included, equals its inference call."""
    model = _model(arch)
    collator = _collator(align_to_completion=aligned, last_block=last_block)
    g = torch.Generator().manual_seed(3)
    lengths, prompts, k = [19, 11], [5, 3], 4
    seqs = [torch.randint(3, 97, (n,), generator=g).tolist() for n in lengths]
    seqs[0][-1] = EOS_ID  # row 0 ends with EOS (padded under "eos"), row 1 was truncated (never padded)
    clean, batch = _batch(collator, seqs, prompts, k, eta=0.5, seed=7)
    labels = batch.pop("labels")
    n_clean = batch.pop("num_clean")
    logits = model(**batch).logits
    assert torch.isfinite(logits).all(), "a padding row produced NaN/inf"
    checked = 0
    for b, seq in enumerate(seqs):
        plain = model(input_ids=torch.tensor([seq])).logits[0]
        assert (logits[b, : len(seq)] - plain).abs().max() <= TOL, "clean half differs from a causal forward"
        origin = prompts[b] if aligned else 0
        noisy = batch["input_ids"][b, n_clean:]
        span = len(seq) - origin
        if last_block == "eos" and seq[-1] == EOS_ID:
            span = (span + k - 1) // k * k  # the block holding EOS is completed with EOS
            assert noisy[len(seq) - origin : span].tolist() == [
                MASK_ID if t == MASK_ID else EOS_ID for t in noisy[len(seq) - origin : span].tolist()]
        for start in range(0, span - k + 1, k):  # complete blocks
            prefix = seq[: origin + start]
            block = noisy[start : start + k].tolist()
            train = logits[b, n_clean + start : n_clean + start + k]
            for with_cache in (False, True):
                ref = _infer_block(model, prefix, block, with_cache)
                err = (train - ref).abs().max().item()
                assert err <= TOL, f"{arch} row {b} block at {start} (cache={with_cache}): max diff {err}"
            checked += 1
    assert checked >= (6 if last_block == "eos" else 5)
    assert (labels[:, n_clean:] != -100).any(), "no MATP target in the batch: the test checks nothing"


def test_dense_mask_is_spec_mask():
    """Unpadded, unaligned: the collator's mask is exactly sbd.masks.training_mask(L, k)."""
    collator = _collator()
    for n, k in [(16, 4), (13, 5), (7, 16), (9, 2)]:
        seqs = [list(range(3, 3 + n))] * 2
        _, batch = _batch(collator, seqs, [0, 0], k, eta=0.3, seed=n)
        assert batch["attention_mask"].shape == (2, 1, 2 * n, 2 * n)
        assert torch.equal(batch["attention_mask"][0, 0], training_mask(n, k))
        assert torch.equal(batch["position_ids"][0], torch.cat([torch.arange(n), torch.arange(n)]))


def test_padding_rows_and_columns():
    """Real queries never see padding; padding queries see only themselves."""
    collator = _collator()
    _, batch = _batch(collator, [list(range(3, 13)), list(range(3, 9))], [0, 0], 4, eta=0.5, seed=0)
    mask = batch["attention_mask"][1, 0]  # row of length 6 in a batch of length 10
    n = 10
    real = torch.zeros(2 * n, dtype=torch.bool)
    real[:6] = real[n : n + 6] = True
    assert not mask[real][:, ~real].any()
    pad_rows = mask[~real]
    assert torch.equal(pad_rows, torch.eye(2 * n, dtype=torch.bool)[~real])
    assert torch.equal(mask[real][:, real], training_mask(6, 4))


def test_flex_block_mask_matches_dense():
    """The CUDA path's mask_mod gives the same mask as the dense CPU mask (checked on CPU)."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from sbd.training import flex as sbd_flex

    captured = {}

    def fake_create(mask_mod, B, H, Q_LEN, KV_LEN, device):
        captured["mask"] = flex.create_mask(mask_mod, B, 1, Q_LEN, KV_LEN, device=device)
        return captured["mask"]

    for aligned in (False, True):
        collator = _collator(align_to_completion=aligned)
        seqs, prompts, k = [list(range(3, 20)), list(range(3, 12))], [4, 2], 3
        clean, batch = _batch(collator, seqs, prompts, k, eta=0.5, seed=1)
        origin = clean["prompt_lengths"] if aligned else torch.zeros(2, dtype=torch.long)
        real_create = flex.create_block_mask
        flex.create_block_mask = fake_create
        try:
            sbd_flex.training_block_mask(clean["lengths"], origin, collator.noisy_lengths(clean, k),
                                         batch["num_clean"], collator.noisy_length(clean, k), k, "cpu")
        finally:
            flex.create_block_mask = real_create
        assert torch.equal(captured["mask"], batch["attention_mask"])
