"""sbd's int8 product (`sbd/native/int8_products.h`, chosen by `sbd.models.quantized.quantize` on a CPU): the
formula torch's kernel computes, each row bit for bit the same alone or among others, whatever the threads
or the instruction set; a model keeps the kernel it was quantized with."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import DEVICE
from sbd.errors import SBDError
from sbd.models import extension, quantized, tiny

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="sbd's int8 product runs on a CPU only")


@pytest.fixture(scope="module")
def ext():
    try:
        return extension.build()
    except RuntimeError:
        pytest.skip("no C++ compiler here: sbd's extension cannot be built (torch's int8 kernel runs)")


def _operands(m: int, n: int = 103, k: int = 96, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, generator=g) / 50 + 1e-3).to(torch.bfloat16)
    return torch.randn(m, k, generator=g), w, scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_instruction_set_every_row_count_and_thread_count_give_the_same_bits(ext, dtype):
    x, w, scale = _operands(9)
    x = x.to(dtype)
    sets = range(ext.int8_isa() + 1)  # plain C++, then AVX2, then AVX-512 where this CPU has them
    want = ext.int8_mm(x, w, scale, 0)
    assert want.dtype == dtype and want.shape == (9, 103)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for use in sets:
                assert torch.equal(ext.int8_mm(x, w, scale, use), want)
                for m in (1, 2, 3, 4, 5, 8):  # rows alone and among others, 4 at a time and one by one
                    assert torch.equal(ext.int8_mm(x[:m], w, scale, use), want[:m])
                assert torch.equal(ext.int8_mm(x[5:6], w, scale, use), want[5:6])
    finally:
        torch.set_num_threads(threads)


def test_it_computes_torch_kernels_formula(ext):
    x, w, scale = _operands(5, n=64, k=576, seed=1)
    exact = (x.double() @ w.double().t()) * scale.double()
    got = ext.int8_mm(x, w, scale)
    assert ((got.double() - exact).abs().max() / exact.abs().max()) < 1e-6  # float32 sums, in order
    # bfloat16 in and out, as torch's kernel: the float sum rounded once to bfloat16, at most one step apart
    xb = x.to(torch.bfloat16)
    ours, torchs = ext.int8_mm(xb, w, scale).float(), torch._weight_int8pack_mm(xb, w, scale).float()
    step = torchs.abs() * 2.0 ** -7
    assert ((ours - torchs).abs() <= step + 1e-30).all()
    assert not torch.equal(ext.int8_mm(xb, w, scale * 2), ext.int8_mm(xb, w, scale))  # the scale is read


def test_quantize_chooses_the_kernel_once_and_the_model_keeps_it(ext, monkeypatch):
    cfg = tiny.tiny_config("llama", vocab_size=64, hidden=32, layers=1, heads=2, kv_heads=1, context=64)
    model = tiny.random_model(cfg, seed=4)
    quantized.quantize(model, "int8")
    head = model.get_output_embeddings()
    assert head.sbd_kernel and all(m.sbd_kernel for m in model.modules() if isinstance(m, quantized.QuantizedLinear))
    x = torch.randn(3, 32)
    assert torch.equal(head(x), ext.int8_mm(x.to(torch.bfloat16), head.qweight, head.scales).float())
    monkeypatch.setenv("SBD_NATIVE", "0")  # switched off later: the model keeps its kernel (its tokens stay)
    assert torch.equal(head(x), ext.int8_mm(x.to(torch.bfloat16), head.qweight, head.scales).float())
    plain = tiny.random_model(cfg, seed=4)
    quantized.quantize(plain, "int8")  # switched off when quantizing: torch's kernel, for the model's life
    head = plain.get_output_embeddings()
    assert not head.sbd_kernel
    assert torch.equal(head(x), torch._weight_int8pack_mm(x.to(torch.bfloat16), head.qweight, head.scales).float())


def test_an_input_size_the_cpu_int8_kernels_cannot_take_is_refused_in_one_line():
    """torch's CPU int8 kernel ends the process on an input size that is not a multiple of 16 (torch 2.13),
    sbd's does not take it: such a model is refused before any layer changes."""
    cfg = tiny.tiny_config("llama", vocab_size=64, hidden=40, layers=1, heads=2, kv_heads=1, context=64)
    model = tiny.random_model(cfg, seed=4)
    for fmt in quantized.FORMATS:
        with pytest.raises(SBDError, match=r"model.layers.0.self_attn.q_proj takes 40 inputs.*multiple of 16"):
            quantized.quantize(model, fmt)
        assert quantized.weights_format(model) is None and not quantized.uses_sbd_int8(
            quantized.QuantizedLinear.from_linear(nn.Linear(40, 8), "int8"))
