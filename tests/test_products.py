"""sbd's int8 and int4 products (`sbd/native/products.h`, chosen by `sbd.models.quantized.quantize` on a CPU):
GGUF's Q8_0 and Q4_1 forms, each weight formed exactly as they define it, each row bit for bit the same alone
or among others, whatever the threads or the instruction set; a model keeps the kernels it was quantized
with."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import DEVICE
from sbd.errors import SBDError
from sbd.models import quantized, tiny

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="sbd's products run on a CPU only")


def _int8(ext, n: int, k: int, g: torch.Generator, tail: int = 0):
    """(product of x and use, the same weights dequantized in float64): Q8_0's form, w = q·d per group of 32,
    then `tail` float32 rows"""
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    d = (torch.rand(n, k // 32, generator=g) / 50 + 1e-3).to(torch.float16)
    rows = torch.randn(tail, k, generator=g) if tail else None
    dense = w.double() * d.double().repeat_interleave(32, 1)
    if tail:
        dense = torch.cat([dense, rows.double()])
    return (lambda x, use=-1: ext.int8_mm(x, w, d, rows, use)), dense


def _int4(ext, n: int, k: int, g: torch.Generator):
    """Q4_1's form: w = q·d + m per group of 32, q in 0..15"""
    q = torch.randint(0, 16, (n, k), generator=g)
    dm = torch.stack([torch.rand(n, k // 32, generator=g) / 10 + 0.01, torch.randn(n, k // 32, generator=g) / 10], -1)
    dm = dm.to(torch.float16)
    packed = ext.int4_pack(q)
    dense = q.double() * dm[..., 0].double().repeat_interleave(32, 1) + dm[..., 1].double().repeat_interleave(32, 1)
    return (lambda x, use=-1: ext.int4_mm(x, packed, dm, use)), dense


PRODUCTS = {"int8": _int8, "int4": _int4, "int8 with float rows": lambda *a: _int8(*a, tail=5)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", PRODUCTS)
def test_every_instruction_set_row_count_and_thread_count_give_the_same_bits(ext, fmt, dtype):
    g = torch.Generator().manual_seed(0)
    mm, _ = PRODUCTS[fmt](ext, 103, 96, g)  # 103 output rows: 4 at a time, then one by one
    x = torch.randn(9, 96, generator=g).to(dtype)
    want = mm(x, 0)
    assert want.dtype == dtype and want.shape == (9, 103 + 5 * (fmt == "int8 with float rows"))
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for use in range(ext.isa() + 1):  # plain C++, then AVX2, then AVX-512 where this CPU has them
                assert torch.equal(mm(x, use), want)
                for m in (1, 2, 3, 4, 5, 6, 7, 8):  # rows alone and among others: 4 at a time, then 3, 2 or 1
                    assert torch.equal(mm(x[:m], use), want[:m])
                assert torch.equal(mm(x[5:6], use), want[5:6])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt", PRODUCTS)
def test_they_compute_their_formula_on_exactly_its_weights(ext, fmt):
    g = torch.Generator().manual_seed(1)
    mm, dense = PRODUCTS[fmt](ext, 64, 576, g)
    for use in range(ext.isa() + 1):  # the identity's rows give back every weight, formed bit for bit
        assert torch.equal(mm(torch.eye(576), use).t(), dense.float())
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
        assert torch.equal(want, ext.int4_mm(x, q.qweight, q.scale_min))
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
    # the same float weights quantized in torch's forms: each within its rounding of the float product
    exact = x @ tiny.random_model(cfg, seed=4).model.layers[0].self_attn.q_proj.weight.detach().t()
    for got in (q(x), want):
        assert (got - exact).abs().max() <= 0.1 * exact.abs().max()
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


@pytest.mark.parametrize("fmt", quantized.FORMATS)
def test_sbds_formats_refuse_another_device_in_one_line(ext, fmt):
    """sbd's formats are its own: moved off the CPU, no kernel there reads them, so the layer says so rather
    than computing garbage (its tensors on the meta device stand for a GPU here)."""
    cfg = tiny.tiny_config("llama", vocab_size=64, hidden=64, layers=1, heads=2, kv_heads=1, context=64)
    model = tiny.random_model(cfg, seed=5)
    quantized.quantize(model, fmt)
    q = model.model.layers[0].self_attn.q_proj
    assert q.sbd_kernel and q.fmt == fmt
    q.qweight = q.qweight.to("meta")
    with pytest.raises(SBDError, match=f"{fmt} weights made on a CPU are in sbd's CPU formats and cannot run on meta"):
        q(torch.randn(2, 64))


def test_every_float16_scale_is_read_exactly_on_every_instruction_set(ext):
    """The numbers beside the int values are float16 (GGUF's): every finite one, subnormals included, is
    read as torch reads it, by the plain C++ conversion and by F16C's alike."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    d = bits[torch.isfinite(bits)]
    d = d[: len(d) // 32 * 32].reshape(-1, 32)  # (N, 32): one output row per 32 numbers, K = 1024
    w = torch.ones(len(d), 32 * 32, dtype=torch.int8)
    one = torch.zeros(1, 1024)
    for group in range(0, 32, 7):
        one.zero_()
        one[0, group * 32] = 1  # the first input of a group: the output is that group's scale
        for use in range(ext.isa() + 1):
            assert torch.equal(ext.int8_mm(one, w, d, None, use)[0], d[:, group].float())


def test_weights_from_q8_0_and_q4_1_are_given_back_with_the_files_own_numbers():
    """`sbd_groups` of float weights that came from a Q8_0 or Q4_1 tensor finds the file's own scales (and
    minima) and values: the weights they form are the float weights bit for bit (what `sbd.models.lossless`
    rests on)."""
    g = torch.Generator().manual_seed(7)
    n, k = 48, 128
    d = (torch.rand(n, k // 32, generator=g) / 20 + 1e-4).to(torch.float16)
    m = (-torch.rand(n, k // 32, generator=g) / 4).to(torch.float16)
    q4 = torch.randint(0, 16, (n, k // 32, 32), generator=g)
    q4[..., 3], q4[..., 9] = 0, 15  # as Q4_1 writes them: each group spans its minimum and maximum
    w4 = (q4.float() * d.float()[..., None] + m.float()[..., None]).reshape(n, k)
    values, dm = quantized.sbd_groups(w4, "int4")
    assert torch.equal(dm[..., 0], d) and torch.equal(dm[..., 1], m) and torch.equal(values.long(), q4.reshape(n, k))
    assert torch.equal(quantized.int4_weights(values, dm), w4)
    q8 = torch.randint(-127, 128, (n, k // 32, 32), generator=g)
    q8[..., 5] = 127 * torch.where(torch.rand(n, k // 32, generator=g) < 0.5, 1, -1)  # Q8_0: |q| reaches 127
    w8 = (q8.float() * d.float()[..., None]).reshape(n, k)
    values, scales = quantized.sbd_groups(w8, "int8")
    assert torch.equal(scales, d) and torch.equal(values.long(), q8.reshape(n, k))
    assert torch.equal(quantized.int8_weights(values, scales), w8)


def test_the_adapters_low_rank_update_is_its_formula_each_row_alone_on_every_instruction_set(ext):
    """`low_rank_add`: out += scale · (x · aᵀ) · bt in place, within float32 rounding of the exact sum, the same
    bits on every instruction set and for each row alone or among others (sizes off the 16 lanes included)."""
    g = torch.Generator().manual_seed(5)
    for k, n, r in ((576, 1536, 16), (70, 37, 4), (16, 16, 1)):
        x, a, bt = (torch.randn(*shape, generator=g) for shape in ((5, k), (r, k), (r, n)))
        out = torch.randn(5, n, generator=g)
        exact = out.double() + 2.0 * (x.double() @ a.double().t()) @ bt.double()
        want = out.clone()
        ext.low_rank_add(want, x, a, bt, 2.0, 0)
        assert ((want.double() - exact).abs().max() / exact.abs().max()) < 1e-6
        for use in range(ext.isa() + 1):
            got = out.clone()
            ext.low_rank_add(got, x, a, bt, 2.0, use)
            assert torch.equal(got, want)
            for i in range(5):
                row = out[i : i + 1].clone()
                ext.low_rank_add(row, x[i : i + 1], a, bt, 2.0, use)
                assert torch.equal(row, want[i : i + 1])
        wide = torch.randn(5, 2 * n, generator=g)  # rows with a stride: a layer's columns in a joint output
        cols = wide[:, :n]
        before = wide[:, n:].clone()
        cols.copy_(out)
        ext.low_rank_add(cols, x, a, bt, 2.0)
        assert torch.equal(cols, want) and torch.equal(wide[:, n:], before)
