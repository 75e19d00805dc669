"""sbd's int8 and int4 products (`sbd/native/products.h`, chosen by `sbd.models.quantized.quantize` on a CPU):
the formulas torch's kernels compute, each row bit for bit the same alone or among others, whatever the
threads or the instruction set; a model keeps the kernels it was quantized with."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import DEVICE
from sbd.errors import SBDError
from sbd.models import extension, quantized, tiny

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="sbd's products run on a CPU only")


@pytest.fixture(scope="module")
def ext():
    try:
        return extension.build()
    except RuntimeError:
        pytest.skip("no C++ compiler here: sbd's extension cannot be built (torch's kernels run)")


def _int8(ext, n: int, k: int, g: torch.Generator):
    """(product of x and use, the same weights dequantized in float64)"""
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, generator=g) / 50 + 1e-3).to(torch.bfloat16)
    return (lambda x, use=-1: ext.int8_mm(x, w, scale, use)), w.double() * scale.double()[:, None]


def _int4(ext, n: int, k: int, g: torch.Generator):
    q = torch.randint(0, 16, (n, k), generator=g)
    sz = torch.stack([torch.rand(n, k // 32, generator=g) / 10 + 0.01, torch.randn(n, k // 32, generator=g) / 10], -1)
    sz = sz.to(torch.bfloat16)
    packed = ext.int4_pack(q)
    dense = (q.double() - 8) * sz[..., 0].double().repeat_interleave(32, 1) + sz[..., 1].double().repeat_interleave(32, 1)
    return (lambda x, use=-1: ext.int4_mm(x, packed, sz, use)), dense


PRODUCTS = {"int8": _int8, "int4": _int4}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", PRODUCTS)
def test_every_instruction_set_row_count_and_thread_count_give_the_same_bits(ext, fmt, dtype):
    g = torch.Generator().manual_seed(0)
    mm, _ = PRODUCTS[fmt](ext, 103, 96, g)  # 103 output rows: 4 at a time, then one by one
    x = torch.randn(9, 96, generator=g).to(dtype)
    want = mm(x, 0)
    assert want.dtype == dtype and want.shape == (9, 103)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for use in range(ext.isa() + 1):  # plain C++, then AVX2, then AVX-512 where this CPU has them
                assert torch.equal(mm(x, use), want)
                for m in (1, 2, 3, 4, 5, 6, 7, 8):  # rows alone and among others: 4, 2 and 1 at a time
                    assert torch.equal(mm(x[:m], use), want[:m])
                assert torch.equal(mm(x[5:6], use), want[5:6])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt", PRODUCTS)
def test_they_compute_their_formula_as_torchs_kernels_do(ext, fmt):
    g = torch.Generator().manual_seed(1)
    mm, dense = PRODUCTS[fmt](ext, 64, 576, g)
    x = torch.randn(5, 576, generator=g)
    exact = x.double() @ dense.t()
    assert ((mm(x).double() - exact).abs().max() / exact.abs().max()) < 1e-6  # float32 sums, in order
    # bfloat16 in and out, as torch's kernels take and give them: the float sum rounded once, so at most one
    # bfloat16 step from torch's
    xb = x.to(torch.bfloat16)
    want = xb.double() @ dense.t()
    got = mm(xb).double()
    assert ((got - want).abs() <= want.abs() * 2.0 ** -7 + 1e-6).all()


@pytest.mark.parametrize("fmt", quantized.FORMATS)
def test_quantize_chooses_the_kernels_once_and_the_model_keeps_them(ext, monkeypatch, fmt):
    cfg = tiny.tiny_config("llama", vocab_size=64, hidden=64, layers=1, heads=2, kv_heads=1, context=64)
    model = tiny.random_model(cfg, seed=4)
    quantized.quantize(model, fmt)
    layers = [m for m in model.modules() if isinstance(m, quantized.QuantizedLinear)]
    assert layers and all(m.sbd_kernel for m in layers)
    q = model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, 64)
    want = q(x)
    # sbd's products take the float32 activations as they are (torch's kernels round them to bfloat16)
    if fmt == "int8":
        assert torch.equal(want, ext.int8_mm(x, q.qweight, q.scales))
    else:
        assert torch.equal(want, ext.int4_mm(x, q.qweight, q.scale_zero))
    assert want.dtype == torch.float32 and not torch.equal(want, want.to(torch.bfloat16).float())
    monkeypatch.setenv("SBD_NATIVE", "0")  # switched off later: the model keeps its kernels (its tokens stay)
    assert torch.equal(q(x), want)
    plain = tiny.random_model(cfg, seed=4)
    quantized.quantize(plain, fmt)  # switched off when quantizing: torch's kernels, for the model's life
    q = plain.model.layers[0].self_attn.q_proj
    assert not any(m.sbd_kernel for m in plain.modules() if isinstance(m, quantized.QuantizedLinear))
    if fmt == "int8":
        assert torch.equal(q(x), torch._weight_int8pack_mm(x.to(torch.bfloat16), q.qweight, q.scales).float())
    else:
        assert torch.equal(q(x), torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), q.qweight, 32,
                                                                   q.scale_zero).float())
    assert (q(x) - want).abs().max() <= 2.0 ** -6 * want.abs().max()  # the same weights: bfloat16 rounding apart
    assert torch.equal(q(x), q(x).to(torch.bfloat16).float())


def test_an_input_size_the_cpu_int8_kernels_cannot_take_is_refused_in_one_line():
    """torch's CPU int8 kernel ends the process on an input size that is not a multiple of 16 (torch 2.13),
    and sbd's does not take it: such a model is refused before any layer changes."""
    cfg = tiny.tiny_config("llama", vocab_size=64, hidden=40, layers=1, heads=2, kv_heads=1, context=64)
    model = tiny.random_model(cfg, seed=4)
    for fmt in quantized.FORMATS:
        with pytest.raises(SBDError, match=r"model.layers.0.self_attn.q_proj takes 40 inputs.*multiple of 16"):
            quantized.quantize(model, fmt)
        assert quantized.weights_format(model) is None
    assert not quantized.QuantizedLinear.from_linear(nn.Linear(40, 8), "int8", sbd=True).sbd_kernel


def test_int4_packed_for_sbds_product_refuses_another_device_in_one_line(ext):
    """sbd's int4 layout is its own: moved off the CPU, no kernel there reads it, so the layer says so rather
    than computing garbage (its tensors on the meta device stand for a GPU here)."""
    cfg = tiny.tiny_config("llama", vocab_size=64, hidden=64, layers=1, heads=2, kv_heads=1, context=64)
    model = tiny.random_model(cfg, seed=5)
    quantized.quantize(model, "int4")
    q = model.model.layers[0].self_attn.q_proj
    assert q.sbd_kernel and q.fmt == "int4"
    q.qweight = q.qweight.to("meta")
    with pytest.raises(SBDError, match="packed for sbd's CPU product and cannot run on meta"):
        q(torch.randn(2, 64))
