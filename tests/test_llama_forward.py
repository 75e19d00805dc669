"""sbd's own forward of Llama-family models (`sbd.decoding.llama_forward`) gives transformers' logits bit for
bit: every forward of a decoding (prefill, one-token steps, verifying forwards with the drafting adapter's
gate, batched rows at different lengths), float32 and quantized, and the same tokens."""

import pytest
import torch

import sbd
from conftest import DEVICE, _model, attach_random_adapter, blocks, random_prompts
from sbd.decoding import native_layers, own_kernels
from sbd.decoding.forward import ModelForward
from sbd.errors import SBDError
from sbd.models import quantized


@pytest.fixture(autouse=True)
def torchs_update_and_kernels(monkeypatch):
    """On a CPU sbd's forward runs its decoder layers from C++, whose adapter update at a block's rows is its own
    loop by default (`native_layers.OWN_UPDATE`), and its attention, norms and activation are sbd's own kernels
    (`own_kernels.OWN`); here all are torch's, as transformers computes them, so that every position can be
    compared bit for bit (tests/test_native_layers.py and tests/test_own_kernels.py check sbd's own)."""
    monkeypatch.setattr(native_layers, "OWN_UPDATE", False)
    monkeypatch.setattr(own_kernels, "OWN", False)

LEAN = ("llama", "qwen2", "mistral")


def _records(model, prompts, lean, **kw):
    """(tokens, [(input ids, logits) of every forward]) of one generate call."""
    seen = []
    out = sbd.generate(model, None, prompts, seed=0, engine={"lean": lean}, eos_token_ids=[],
                       observer=lambda r: seen.append((r.input_ids.clone(), r.logits.clone())), **kw)
    return out.token_ids, seen


def _same_forwards(model, prompts, **kw):
    want_tokens, want = _records(model, prompts, False, **kw)
    got_tokens, got = _records(model, prompts, None, **kw)
    assert got_tokens == want_tokens
    assert len(got) == len(want) > 1
    for (ids_g, lg), (ids_w, lw) in zip(got, want):
        assert torch.equal(ids_g, ids_w)
        assert torch.equal(lg, lw), (lg - lw).abs().max()


@pytest.mark.parametrize("arch", LEAN)
@pytest.mark.parametrize("method", ["ntp", "sbd", "sbd-verify"])
def test_every_forward_is_transformers_bit_for_bit(arch, method):
    model = _model.__wrapped__(arch, seed=4)
    assert ModelForward(model).lean is not None
    attach_random_adapter(model, seed=1)
    extra = {"draft": "block"} if method == "sbd-verify" else {}
    _same_forwards(model, random_prompts(3, 300, seed=2), method=method, max_new_tokens=12, **blocks(method, 4), **extra)
    _same_forwards(model, random_prompts(1, 300, seed=3), method=method, max_new_tokens=12, **blocks(method, 4), **extra)


@pytest.mark.parametrize("fmt", quantized.FORMATS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_quantized_forwards_are_transformers_bit_for_bit(arch, fmt):
    model = _model.__wrapped__(arch, seed=5)
    attach_random_adapter(model, seed=2)  # as `sbd.load` does: the adapter first, then the base layers quantized
    quantized.quantize(model, fmt)
    assert ModelForward(model).lean is not None
    for method, extra in (("ntp", {}), ("sbd-verify", {"draft": "block"})):
        _same_forwards(model, random_prompts(3, 300, seed=6), method=method, max_new_tokens=12,
                       **blocks(method, 4), **extra)


@pytest.mark.parametrize("fmt", quantized.FORMATS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_joint_products_are_each_layers_own_bit_for_bit(arch, fmt):
    """q, k, v (and gate, up) in one kernel call on a CPU, q and k rotated together: every logit as
    transformers' modules give it (qwen2: with biases), alone and batched, with the adapter's gated updates,
    where the int4 layers are whole tiles of the kernel's packing (64 rows: head size 64, as most models have)."""
    model = _model.__wrapped__(arch, seed=7, hidden=128, heads=2, kv_heads=1)
    seeded = torch.Generator().manual_seed(4)
    with torch.no_grad():  # transformers starts biases at zero, where adding them would go unchecked
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=seeded, device="cpu").to(m.bias.device))
    attach_random_adapter(model, seed=3)
    quantized.quantize(model, fmt)
    a, m = model.model.layers[0].self_attn, model.model.layers[0].mlp
    joined = quantized.joint_product((a.q_proj, a.k_proj, a.v_proj)), quantized.joint_product((m.gate_proj, m.up_proj))
    assert all(p is not None for p in joined) == (DEVICE.type == "cpu")
    for method, extra in (("ntp", {}), ("sbd-verify", {"draft": "block"})):
        _same_forwards(model, random_prompts(3, 300, seed=8), method=method, max_new_tokens=12,
                       **blocks(method, 4), **extra)
        _same_forwards(model, random_prompts(1, 300, seed=9), method=method, max_new_tokens=12,
                       **blocks(method, 4), **extra)


@pytest.mark.parametrize("sbd", [False, True], ids=["torch's kernels", "sbd's products"])
def test_int4_layers_join_only_at_the_kernels_tiles(monkeypatch, sbd):
    """torch's CPU int4 kernel packs output rows in tiles of 64: layers of 32 rows would read each other's
    weights if joined, so they keep their own calls (int8 layers, row by row, always join; so do layers on
    sbd's products, which keep each output row's weights together)."""
    if not sbd:
        monkeypatch.setattr(quantized, "sbd_products", lambda: False)
    model = _model.__wrapped__("llama", seed=7)  # k and v: 32 rows
    quantized.quantize(model, "int4")
    a, m = model.model.layers[0].self_attn, model.model.layers[0].mlp
    sbd_here = sbd and a.q_proj.sbd_kernel
    assert sbd_here == (sbd and DEVICE.type == "cpu" and quantized.sbd_products())
    assert (quantized.joint_product((a.q_proj, a.k_proj, a.v_proj)) is None) == (not sbd_here)
    assert (quantized.joint_product((m.gate_proj, m.up_proj)) is not None) == (DEVICE.type == "cpu")


def test_other_models_and_foreign_hooks_run_through_transformers():
    qwen3 = _model.__wrapped__("qwen3")
    fwd = ModelForward(qwen3)
    assert fwd.lean is None and "qwen3" in fwd.why_not_lean
    llama = _model.__wrapped__("llama")
    assert ModelForward(llama, lean=False).lean is None
    seen = []
    handle = llama.model.layers[0].mlp.register_forward_hook(lambda m, a, o: seen.append(1))
    try:
        fwd = ModelForward(llama)
        assert fwd.lean is None and "hooks" in fwd.why_not_lean
        sbd.generate(llama, None, [[5, 6, 7]], method="ntp", max_new_tokens=3)
        assert seen  # the user's hook ran
    finally:
        handle.remove()
    assert ModelForward(llama).lean is not None


def test_generate_refuses_a_lean_setting_that_is_not_a_switch():
    llama = _model("llama")
    with pytest.raises(SBDError, match="lean"):
        sbd.generate(llama, None, [[5, 6, 7]], method="ntp", max_new_tokens=2, engine={"lean": "yes"})
