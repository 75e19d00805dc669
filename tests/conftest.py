"""Shared tiny models: random weights with a scaled output layer, so that logits are decisive and token
equality between two decoding paths means something."""

from __future__ import annotations

import functools
import os

import pytest
import torch

import device_audit
from sbd.models import tiny

torch.set_num_threads(int(os.environ.get("SBD_TEST_THREADS", "2")))  # 1 on a machine shared with other jobs
# The tiny models' device: cpu (CI), or e.g. cuda on a GPU machine (benchmarks/gpu/first_call.sh), so that the
# same exactness tests run on the device's kernels. No global default device: the models are built on the
# CPU (the same weights on every device) and moved there; a test puts what meets a model on its device
# explicitly (device=model.device or DEVICE) and draws random values on the CPU from a CPU generator
# (device="cpu", the same draws on every device), then moves them. The device audit (on unless SBD_TEST_DEVICE_AUDIT=0) checks this on
# a CPU-only machine (tests/device_audit.py).
DEVICE = torch.device(os.environ.get("SBD_TEST_DEVICE", "cpu"))
if device_audit.ENABLED:
    device_audit.install()
ARCHS = tiny.ARCHS
if DEVICE.type == "cpu":  # built before the tests, so that quantized models run their native layers in every test
    from sbd.models import extension

    try:
        extension.build()
    except RuntimeError:
        pass  # tests/test_native_layers.py says why
LOGIT_SCALE = 150.0  # a mix of near-certain and uncertain positions: the EB rule has choices to make


@functools.lru_cache(maxsize=None)
def _tokenizer():
    return tiny.build_tokenizer(vocab_size=400)


_MODELS: dict[tuple[str, int], torch.nn.Module] = {}  # the shared tiny models, built once a session
_HOME = DEVICE


def _fresh_model(arch: str, seed: int = 0, hidden: int = 64, heads: int = 4, kv_heads: int = 2):
    """A new tiny model of `arch` and `seed` on DEVICE (built on the CPU: the same weights on every device)."""
    device_audit.arm()  # this test runs on DEVICE: its own tensors must say where they go
    tok = _tokenizer()
    cfg = tiny.tiny_config(arch, vocab_size=len(tok), hidden=hidden, layers=2, heads=heads, kv_heads=kv_heads,
                           context=512)
    cfg.eos_token_id = tok.eos_token_id
    model = tiny.random_model(cfg, seed=seed, logit_scale=LOGIT_SCALE)
    model.config.sbd_mask_token_id = tok.mask_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.to(DEVICE)


def _model(arch: str, seed: int = 0):
    """The shared tiny model of `arch` and `seed`, on DEVICE. Tests hand it back as they found it
    (`_shared_models_left_clean`); `_model.__wrapped__` makes a private one, as when this was an lru_cache."""
    global _HOME
    device_audit.arm()
    if (arch, seed) not in _MODELS:
        _MODELS[arch, seed] = _fresh_model(arch, seed)
        _HOME = _MODELS[arch, seed].device  # DEVICE with its index (cuda:0)
        _WEIGHTS[arch, seed] = {k: v.detach().clone() for k, v in _MODELS[arch, seed].state_dict().items()}
    return _MODELS[arch, seed]


_WEIGHTS: dict[tuple[str, int], dict] = {}  # each shared model's weights as built (a few MB in all)


_model.__wrapped__ = _fresh_model


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item, for `_shared_models_left_clean` (did the test pass?)."""
    report = (yield).get_result()
    setattr(item, f"sbd_report_{report.when}", report)


def restore_shared_models() -> list[str]:
    """Every shared tiny model as built: no drafting adapter, no sampler head, on DEVICE, in eval mode, its
    weights trainable. Returns what a test had left changed that changes what the next test computes."""
    from sbd.drafters import adapter as adapters
    from sbd.drafters import sampler_head as heads

    left = []
    for (arch, seed), m in _MODELS.items():
        if adapters.adapter_of(m) is not None:
            adapters.detach(m)
            left.append(f"a drafting adapter on _model({arch!r}, seed={seed})")
        if heads.head_of(m) is not None:
            heads.detach(m)
            left.append(f"a sampler head on _model({arch!r}, seed={seed})")
        weight = m.get_input_embeddings().weight  # (cheap checks: this runs after every test)
        if weight.device != _HOME:  # e.g. moved by an API that takes a device (SBDLM(pretrained=model, device=...))
            left.append(f"_model({arch!r}, seed={seed}) moved to {weight.device}")
            m.to(_HOME)
        if m.training:  # training tests switch it to training mode and freeze its weights
            m.eval()
        if not weight.requires_grad:
            m.requires_grad_(True)
        built = _WEIGHTS[arch, seed]
        changed = [k for k, v in m.state_dict().items() if k not in built or not torch.equal(v, built[k])]
        if changed:  # e.g. a round trip through bfloat16 rounds them
            m.load_state_dict(built)
            left.append(f"the weights of _model({arch!r}, seed={seed}) changed ({changed[0]}, …)")
    return left


@pytest.fixture(autouse=True)
def _shared_models_left_clean(request):
    """After every test and its fixtures' own teardowns, whatever happened, the shared tiny models are
    restored (so one failure cannot spread to later tests as "already attached") and no global default
    device is set. A test that passed and left an adapter or a head attached or a model moved fails here:
    the next test would have run on a changed model."""
    yield
    device_audit.disarm()
    left = restore_shared_models()
    device_audit.default_device_is_cpu()
    call = getattr(request.node, "sbd_report_call", None)
    if left and call is not None and call.passed:
        pytest.fail("the test left " + " and ".join(left) + " (undone now): undo it in a finally", pytrace=False)


@pytest.fixture(scope="session")
def ext():
    """sbd's compiled extension (built above); the test is skipped where it cannot be built here."""
    from sbd.models import extension

    try:
        return extension.build()
    except RuntimeError:
        pytest.skip("no C++ compiler here: sbd's extension cannot be built (torch's operations run)")


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


def blocks(method: str, block_size: int) -> dict:
    """`block_size` as a keyword for the methods that read it (NTP has no blocks, and refuses one)."""
    return {} if method == "ntp" else {"block_size": block_size}


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
    from sbd.drafters import adapter as adapters

    ad = adapters.attach(model, adapters.AdapterConfig(r=r, block_size=4, trained_for=["sbd", "sbd-verify"]))
    try:
        g = torch.Generator().manual_seed(seed)  # drawn on the CPU: the same adapter on every device
        with torch.no_grad():
            for p in ad.lora_B.values():
                p.copy_(torch.randn(p.shape, generator=g, device="cpu") * scale)
            ad.mask_embedding.copy_(torch.randn(ad.mask_embedding.shape, generator=g, device="cpu"))
    except BaseException:
        adapters.detach(model)  # not half made and left behind on a shared model
        raise
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
