"""Shared tiny models: random weights with a scaled output layer, so that logits are decisive and token
equality between two decoding paths means something."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from sbd.models import tiny

torch.set_num_threads(int(os.environ.get("SBD_TEST_THREADS", "2")))  # 1 on a machine shared with other jobs
# The tiny models' device: cpu (CI), or e.g. cuda on a GPU machine (benchmarks/gpu/first_call.sh), so that the
# same exactness tests run on the device's kernels.
DEVICE = torch.device(os.environ.get("SBD_TEST_DEVICE", "cpu"))
if DEVICE.type != "cpu":  # tensors the tests build without a device (prompts, reference inputs) go there too
    torch.set_default_device(DEVICE)
ARCHS = tiny.ARCHS
LOGIT_SCALE = 150.0  # a mix of near-certain and uncertain positions: the EB rule has choices to make


@functools.lru_cache(maxsize=None)
def _tokenizer():
    return tiny.build_tokenizer(vocab_size=400)


@functools.lru_cache(maxsize=None)
def _model(arch: str, seed: int = 0):
    tok = _tokenizer()
    cfg = tiny.tiny_config(arch, vocab_size=len(tok), hidden=64, layers=2, heads=4, kv_heads=2, context=512)
    cfg.eos_token_id = tok.eos_token_id
    model = tiny.random_model(cfg, seed=seed, logit_scale=LOGIT_SCALE)
    model.config.sbd_mask_token_id = tok.mask_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.to(DEVICE)


@pytest.fixture(scope="session")
def tokenizer():
    return _tokenizer()


@pytest.fixture(params=ARCHS)
def arch(request):
    return request.param


@pytest.fixture
def model(arch):
    return _model(arch)


@pytest.fixture
def llama():
    return _model("llama")


def random_prompts(n: int, vocab: int, lengths=(3, 11, 6, 1, 17), seed: int = 0) -> list[list[int]]:
    """Token-id prompts of different lengths that avoid the special tokens (ids 0-2)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (lengths[i % len(lengths)],), generator=g, device="cpu").tolist() for i in range(n)]


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Hugging Face greedy `generate` for one prompt: the new tokens, up to and including EOS."""
    with torch.no_grad():
        ids = torch.tensor([prompt], device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=n)[0, len(prompt):].tolist()
    eos = model.generation_config.eos_token_id
    return out[: out.index(eos) + 1] if eos in out else out


def attach_random_adapter(model, seed=0, scale=0.5, r=4):
    """Attach a drafting adapter whose updates are large and random (a fresh one would be the identity); it
    says it fits both decodings, so that the tests can drive the gate through plain SBD too."""
    from sbd import adapter as adapters

    ad = adapters.attach(model, adapters.AdapterConfig(r=r, block_size=4, trained_for=["sbd", "sbd-verify"]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ad.lora_B.values():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
        ad.mask_embedding.copy_(torch.randn(ad.mask_embedding.shape, generator=g))
    return ad


def trainable_adapted(arch: str, tokenizer, seed: int):
    """A frozen tiny model of ordinary logit scale (gradients of ordinary size) with a small random
    adapter on it, for the training-forward equivalence tests: (model, adapter)."""
    cfg = tiny.tiny_config(arch, vocab_size=len(tokenizer), hidden=64, layers=2, heads=4, kv_heads=2, context=128)
    model = tiny.random_model(cfg, seed=seed)
    model.config.sbd_mask_token_id = tokenizer.mask_token_id
    model.requires_grad_(False)
    return model, attach_random_adapter(model, scale=0.1)


@pytest.fixture
def cheap_width(monkeypatch):
    """Adaptive drafting without timing the model: a forward of width w costs 1 + 0.02 (w − 1) one-token
    forwards (narrow layers), so drafts always pay."""
    import importlib

    g = importlib.import_module("sbd.decoding.generate")
    monkeypatch.setattr(g, "forward_costs", lambda m, batch=1: (lambda w: 1.0 + 0.02 * (w - 1)))
