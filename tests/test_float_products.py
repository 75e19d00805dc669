"""sbd's float32 product on a CPU (`f32_mm`, `sbd.decoding.own_kernels.FloatProduct`): each output its dot
product, each row bit for bit the row alone on every instruction set and thread count; bad input refused in
one line; engines take it for float32 layers where sbd's kernels serve the model, with the "exact" plan; a
verifying forward's committed row is the one-token forward's bit for bit, so sbd-verify writes NTP's tokens;
forwards wider than `FLOAT_ROWS` take torch's product, the C++ and Python layers alike."""

import pytest
import torch

import sbd
from conftest import DEVICE, _model, attach_random_adapter, blocks, random_prompts
from sbd.benchmarking.forward_cost import Shape, _attending, _prefilled
from sbd.decoding import own_kernels
from sbd.decoding.attention import exact_plan, routed
from sbd.decoding.cache import crop
from sbd.decoding.forward import ModelForward
from sbd.drafters.adapter import gated
from test_native_layers import METHODS, SAME_LENGTHS, _randomized, _same_forwards

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="sbd's float32 product runs on a CPU only")


def test_each_output_is_its_dot_product_each_row_alone_on_every_instruction_set(ext):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 80, generator=g, device="cpu")
    ws = [torch.randn(n, 80, generator=g, device="cpu") for n in (5, 70, 3)]
    got = ext.f32_mm(x, ws)
    want = x.double() @ torch.cat(ws).double().t()
    assert got.shape == (7, 78) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(torch.cat([ext.f32_mm(x, [w]) for w in ws], 1), got)  # side by side = one by one
    for r in range(7):
        assert torch.equal(ext.f32_mm(x[r : r + 1], ws), got[r : r + 1])
    for use in range(ext.isa() + 1):  # plain C++, AVX2, AVX-512: as many as this CPU has
        assert torch.equal(ext.f32_mm(x, ws, use), got)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(ext.f32_mm(x, ws), got)
    finally:
        torch.set_num_threads(threads)
    assert ext.f32_mm(x.bfloat16(), ws).dtype == torch.bfloat16


def test_bad_input_is_refused_in_one_line(ext):
    x, w = torch.randn(2, 32), torch.randn(4, 32)
    for args, says in (((x[:, :24], [w[:, :24]]), "multiple of 16"), ((x, [w.double()]), "float32"),
                       ((x, [w[:, :16]]), r"\(N, K\)"), ((x, []), "at least one")):
        with pytest.raises(RuntimeError, match=says) as err:
            ext.f32_mm(*args)
        assert "\n" not in str(err.value).strip()


def _float(seed, **shape):
    model = _randomized(_model.__wrapped__("llama", seed=seed, **shape), seed)
    attach_random_adapter(model, seed=seed)
    return model


def test_engines_take_it_for_float32_layers_where_sbds_kernels_serve(ext, monkeypatch):
    model = _float(41, hidden=128, heads=2, kv_heads=1)
    run = ModelForward(model)
    assert run.lean.float_invariant and run.exact and run.float_exact
    assert isinstance(run.lean.head, own_kernels.FloatProduct)
    assert isinstance(run.lean.layers[0][6][0], own_kernels.FloatProduct)  # q, k and v in one call
    monkeypatch.setattr(own_kernels, "OWN", False)
    run = ModelForward(model)
    assert not run.lean.float_invariant and not run.exact and run.lean.head is None
    monkeypatch.undo()
    odd = _float(41, hidden=64, heads=8, kv_heads=2)  # head size 8: not sbd's kernels
    assert not ModelForward(odd).exact


def test_a_committed_row_is_the_one_token_forwards_bit_for_bit(ext):
    """A verifying forward (one committed token, then a block of masks) on the exact plan: its first row's
    logits are the one-token forward's at the same position, bit for bit, through the C++ and Python layers."""
    model = _float(42, hidden=128, heads=2, kv_heads=1)
    lean = ModelForward(model).lean
    vocab = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(43)
    cached = 40
    for native in (lean.native, None):
        lean.native = native
        with torch.inference_mode():
            cache, pad = _prefilled(model, 1, cached, 8, torch.device("cpu"), gen)
            first = int(torch.randint(3, vocab, (1,), generator=gen, device="cpu"))
            rows = {}
            for w in (1, 4, 8):
                s = Shape(1, w, cached, n_commit=1)
                ids = torch.cat([torch.tensor([[first]], device="cpu"), torch.randint(3, vocab, (1, w - 1), generator=gen, device="cpu")], 1)
                kw = _attending(model, s, dict(input_ids=ids, position_ids=(cached + torch.arange(w, device="cpu"))[None]), pad,
                                cached)
                with gated(model, 1 if w > 1 else None), routed(model, True):
                    rows[w] = lean(ids, kw["position_ids"], cache, exact_plan([(cached, w, 1, False)], w, False),
                                   w).logits[0, 0]
                crop(cache, w)
        assert torch.equal(rows[4], rows[1]) and torch.equal(rows[8], rows[1])


def test_sbd_verify_writes_ntp_tokens_alone_and_batched(ext):
    model = _float(44, hidden=128, heads=2, kv_heads=1)
    for prompts in (random_prompts(1, 300, seed=45), random_prompts(3, 300, seed=46)):
        ntp = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=16, eos_token_ids=[]).token_ids
        for extra in ({"draft": "block", "block_size": 4}, {}):  # whole blocks; the defaults' own drafts
            verify = sbd.generate(model, None, prompts, method="sbd-verify", max_new_tokens=16, eos_token_ids=[],
                                  **extra)
            assert verify.token_ids == ntp


def test_wider_forwards_take_torchs_product_in_both_layers_alike(ext, monkeypatch):
    """With FLOAT_ROWS at 2 a decoding mixes forwards on sbd's product and on torch's (batches, blocks, the
    prompt): the C++ layers give the Python layers' logits bit for bit in every one."""
    monkeypatch.setattr(own_kernels, "FLOAT_ROWS", 2)
    model = _float(47, hidden=128, heads=2, kv_heads=1)
    assert ModelForward(model).lean.float_invariant
    seen = {"sbd": 0, "torch": 0}
    call = own_kernels.FloatProduct.runs

    def counting(self, rows):
        got = call(self, rows)
        seen["sbd" if got else "torch"] += 1
        return got

    monkeypatch.setattr(own_kernels.FloatProduct, "runs", counting)
    for method, extra in METHODS[:3]:
        for prompts in (random_prompts(3, 300, seed=48), SAME_LENGTHS):
            _same_forwards(model, prompts, monkeypatch, method=method, max_new_tokens=10, **blocks(method, 4),
                           **extra)
    assert seen["sbd"] > 0 and seen["torch"] > 0
