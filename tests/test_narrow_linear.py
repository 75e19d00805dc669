"""Narrow linear layers (sbd/models/narrow_linear.py): W·xᵀ for few-token forwards on CPU.

- the product equals torch's F.linear (float rounding only) at every width it takes, padded or not,
  with and without bias, and is not used where gradients are needed or forwards are wide;
- switching is reversible and keeps parameters, state dict and hooks;
- decoding through narrow layers keeps every exactness promise: sbd-verify (block and adaptive drafts)
  with a drafting adapter gives the original model's Hugging Face greedy tokens on four architectures,
  alone and batched, and plain SBD decodes as with F.linear;
- sbd.load turns it on for float32 on CPU, and off on request.
"""

from __future__ import annotations

import pytest
import torch
from conftest import attach_random_adapter, hf_greedy, random_prompts
from torch import nn

import sbd
from sbd.drafters import adapter as adapters
from sbd.models import narrow_linear as narrow
from sbd.models.narrow_linear import NarrowLinear, use_narrow_linear, uses_narrow_linear


def _linear(n_in=48, n_out=40, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
def test_narrow_product_equals_f_linear_at_every_width(bias):
    lin = _linear(bias=bias)
    ref_weight, ref_bias = lin.weight.detach().clone(), None if lin.bias is None else lin.bias.detach().clone()
    use_narrow_linear(lin, widest=narrow.WIDEST)
    assert type(lin) is NarrowLinear
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for rows, width in [(1, 1), (1, 2), (1, 5), (1, 8), (1, 9), (1, 17), (2, 4), (3, 7), (4, 16), (1, 64),
                            (1, 65), (5, 20)]:
            x = torch.randn(rows, width, 48, generator=g)
            out = lin(x)
            ref = torch.nn.functional.linear(x, ref_weight, ref_bias)
            assert out.shape == ref.shape
            assert out.is_contiguous()
            assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5), (rows, width)
        flat = torch.randn(6, 48, generator=g)  # 2-D input
        assert torch.allclose(lin(flat), torch.nn.functional.linear(flat, ref_weight, ref_bias), atol=1e-5)


def test_narrow_path_only_where_it_is_meant(monkeypatch):
    lin = _linear()
    use_narrow_linear(lin, widest=narrow.WIDEST, single=False)
    calls = []
    monkeypatch.setattr(narrow, "narrow_linear", lambda *a: calls.append(a[0].shape) or torch.nn.functional.linear(*a))
    with torch.no_grad():
        lin(torch.randn(1, 1, 48))  # one token, weights in the cache: the matrix-vector product as it was
        lin(torch.randn(1, narrow.WIDEST + 1, 48))  # prefill-wide
    assert calls == []
    with torch.no_grad():
        lin(torch.randn(2, 3, 48))
    assert calls == [torch.Size([2, 3, 48])]
    lin.narrow_single = True  # weights that stream from memory: one token too, as two columns
    with torch.no_grad():
        lin(torch.randn(1, 1, 48))
    assert calls[-1] == torch.Size([1, 1, 48])
    x = torch.randn(1, 4, 48, requires_grad=True)  # training: torch's own path, gradients flow
    lin(x).sum().backward()
    assert calls[-1] == torch.Size([1, 1, 48]) and len(calls) == 2  # no call for the training forward
    assert x.grad is not None and lin.weight.grad is not None


def test_switching_keeps_parameters_state_and_hooks(llama):
    state = {k: v.clone() for k, v in llama.state_dict().items()}
    seen = []
    handle = llama.lm_head.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    try:
        n = use_narrow_linear(llama)
        assert n == sum(1 for m in llama.modules() if type(m) is NarrowLinear) > 0
        assert uses_narrow_linear(llama)
        with torch.no_grad():
            llama(input_ids=torch.tensor([[5, 6, 7]], device=llama.device))
        assert seen and seen[-1][-2] == 3
        assert llama.state_dict().keys() == state.keys()
        assert all(torch.equal(v, state[k]) for k, v in llama.state_dict().items())
    finally:
        assert use_narrow_linear(llama, False) == n
        handle.remove()
    assert not uses_narrow_linear(llama)
    assert all(type(m) is not NarrowLinear for m in llama.modules())


def test_wide_and_one_token_narrow_forwards_only_for_weights_that_leave_the_cache():
    small = _linear()
    use_narrow_linear(small)
    assert small.narrow_widest == narrow.ALWAYS  # cached weights: x·Wᵀ is faster beyond a few columns
    assert small.narrow_single is False  # and the matrix-vector product is the faster one for one token
    big = nn.Sequential(nn.Linear(4096, narrow.CACHED_BYTES // (4 * 4096) + 1, bias=False))
    use_narrow_linear(big)
    assert big[0].narrow_widest == narrow.WIDEST and big[0].narrow_single is True
    use_narrow_linear(big, False)
    assert type(big[0]) is nn.Linear and not {"narrow_widest", "narrow_single"} & set(big[0].__dict__)


def test_one_token_product_takes_two_columns(monkeypatch):
    """A one-token product is computed with a zero second column (a matrix product, not torch's
    matrix-vector one) and equals F.linear up to rounding."""
    lin = _linear()
    use_narrow_linear(lin, widest=narrow.WIDEST, single=True)
    shapes = []
    real_mm = torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: shapes.append(tuple(b.shape)) or real_mm(a, b))
    x = torch.randn(1, 1, 48)
    with torch.no_grad():
        out = lin(x)
    assert torch.allclose(out, torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    lin.bias = None
    with torch.no_grad():
        lin(x)
    assert shapes == [(48, 2)]  # the bias-free product (with a bias it is one addmm over the same columns)


@pytest.mark.parametrize("draft", ["block", "adaptive"])
def test_verify_through_narrow_layers_gives_the_original_models_hf_greedy_tokens(model, draft):
    prompts = random_prompts(5, model.config.vocab_size)
    ref = [hf_greedy(model, p, 30) for p in prompts]  # before any switch: torch's own linear layers
    attach_random_adapter(model)
    use_narrow_linear(model, widest=narrow.WIDEST, single=True)  # every forward of these tiny runs: narrow
    try:
        alone = [sbd.generate(model, None, [p], method="sbd-verify", block_size=8, draft=draft,
                              max_new_tokens=30).token_ids[0] for p in prompts]
        batched = sbd.generate(model, None, prompts, method="sbd-verify", block_size=8, draft=draft,
                               max_new_tokens=30)
    finally:
        use_narrow_linear(model, False)
        adapters.detach(model)
    assert alone == ref
    assert batched.token_ids == ref


def test_ntp_loop_through_one_token_narrow_products_gives_hf_greedy_tokens(model):
    """Every forward of our NTP loop is one token wide: with `single` they all take the two-column
    product; the tokens stay the model's Hugging Face greedy tokens, alone and batched."""
    prompts = random_prompts(4, model.config.vocab_size)
    ref = [hf_greedy(model, p, 24) for p in prompts]
    use_narrow_linear(model, widest=narrow.WIDEST, single=True)
    try:
        alone = [sbd.generate(model, None, [p], method="ntp", max_new_tokens=24).token_ids[0] for p in prompts]
        batched = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=24)
    finally:
        use_narrow_linear(model, False)
    assert alone == ref and batched.token_ids == ref


def test_plain_sbd_decodes_the_same_through_narrow_layers(model):
    prompts = random_prompts(3, model.config.vocab_size)
    kw = dict(method="sbd", block_size=4, gamma=0.35, max_new_tokens=24, eos_token_ids=[])
    attach_random_adapter(model)
    try:
        plain = sbd.generate(model, None, prompts, **kw)
        use_narrow_linear(model, widest=narrow.WIDEST, single=True)
        narrowed = sbd.generate(model, None, prompts, **kw)
    finally:
        use_narrow_linear(model, False)
        adapters.detach(model)
    assert narrowed.token_ids == plain.token_ids and narrowed.nfe == plain.nfe


def test_adapter_decoding_update_equals_the_training_formula(llama):
    """The decoding hook adds the gated update in place in one fused product; with gradients on it
    takes the plain formula. Both give the same logits."""
    attach_random_adapter(llama)
    mask = llama.config.sbd_mask_token_id
    ids = torch.tensor([[5, 9, 11, 3, mask, mask]], device=llama.device)
    try:
        for s in (0, 2, 4):
            with adapters.gated(llama, s):
                with torch.no_grad():
                    fused = llama(input_ids=ids).logits
                with torch.enable_grad():
                    plain = llama(input_ids=ids).logits.detach()
            assert torch.allclose(fused, plain, rtol=1e-5, atol=1e-4), s  # logits of size ~40: rounding only
    finally:
        adapters.detach(llama)


def test_sbd_load_uses_narrow_layers_on_amd_cpus_in_float32_unless_asked_not_to(monkeypatch):
    """Where it was measured to pay (AMD CPUs with MKL) and nowhere else by default: on an Intel Xeon MKL's
    own products were 2.4x faster at one token."""
    monkeypatch.setattr(narrow, "cpu_vendor", lambda: "AuthenticAMD")
    assert narrow.worth_it("cpu", torch.float32) == torch.backends.mkl.is_available()
    model, _ = sbd.load("demo")
    assert uses_narrow_linear(model) == torch.backends.mkl.is_available()
    model, _ = sbd.load("demo", narrow_linear=False)
    assert not uses_narrow_linear(model)
    model, _ = sbd.load("demo", narrow_linear=True)
    assert uses_narrow_linear(model)
    assert not narrow.worth_it("cpu", torch.bfloat16) and not narrow.worth_it("cuda", torch.float32)
    for vendor in ("GenuineIntel", None):
        monkeypatch.setattr(narrow, "cpu_vendor", lambda v=vendor: v)
        assert not narrow.worth_it("cpu", torch.float32)
        model, _ = sbd.load("demo")
        assert not uses_narrow_linear(model)
