"""sbd's own kernels for a decoding forward (`sbd.decoding.own_kernels`): attention (`attend_rows`,
sbd/native/attention.h), the RMS norm and the SiLU-gated product (rows.h). Each computes its formula; the same
bits on every instruction set, thread count and company (each row alone); the keys each query of an "exact" or
"open" forward sees (`query_ends`); and the engine's forwards on them: the C++ and Python layers alike,
sbd-verify with NTP's tokens, and only rounding between them and torch's operations."""

import pytest
import torch

import sbd
from conftest import DEVICE, _model, attach_random_adapter, random_prompts
from sbd.decoding import own_kernels
from sbd.decoding.attention import attend, exact_plan, query_ends, uniform_plan
from sbd.decoding.forward import ModelForward
from sbd.models import extension, quantized
from test_attention import dense_reference, layout_mask

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="sbd's attention kernel runs on a CPU only")


def _inputs(b, heads, kv_heads, w, s, d, seed, peak=1.0):
    """q as the layers hand it over (a transposed view), k and v as a cache's first s positions, and ends with
    an empty row and a full one."""
    gen = torch.Generator().manual_seed(seed)
    q = (peak * torch.randn(b, w, heads, d, generator=gen)).transpose(1, 2)
    k = torch.randn(b, kv_heads, s + 5, d, generator=gen)[:, :, :s]
    v = torch.randn(b, kv_heads, s + 5, d, generator=gen)[:, :, :s]
    ends = torch.randint(1, s + 1, (b, w), generator=gen)
    ends[0, 0], ends[-1, -1] = 0, s
    return q, k, v, ends


def _reference(q, k, v, ends, scale, dtype=torch.float64):
    """Each row's softmax attention over its first ends[b, w] keys, in `dtype` (an empty row: zeros)."""
    b_, heads, w_, d = q.shape
    group = heads // k.shape[1]
    out = torch.zeros(b_, heads, w_, d, dtype=dtype)
    for b in range(b_):
        for h in range(heads):
            for w in range(w_):
                e = int(ends[b, w])
                if e:
                    keys, values = k[b, h // group, :e].to(dtype), v[b, h // group, :e].to(dtype)
                    out[b, h, w] = torch.softmax(keys @ q[b, h, w].to(dtype) * scale, 0) @ values
    return out


@pytest.mark.parametrize("peak", [1.0, 40.0], ids=["soft", "peaked"])
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (8, 2)])
def test_each_row_is_its_softmax_attention(ext, heads, kv_heads, d, peak):
    q, k, v, ends = _inputs(2, heads, kv_heads, 5, 70, d, seed=d + heads, peak=peak)
    out = ext.attend_rows(q, k, v, ends, d ** -0.5)
    assert out.shape == q.shape and out.dtype == torch.float32
    exact = _reference(q, k, v, ends, d ** -0.5)
    torchs = (_reference(q, k, v, ends, d ** -0.5, torch.float32).double() - exact).abs().max()  # float32's own error
    assert (out.double() - exact).abs().max() <= 2 * torchs + 2e-6
    assert (out[0, :, 0] == 0).all()  # a row that sees no key: zeros, as the exact plan's padding columns


def test_every_instruction_set_thread_count_and_company_give_the_same_bits(ext):
    """Row-invariance: a row computed alone, in any batch, column or group of heads, is the same bits."""
    q, k, v, ends = _inputs(2, 9, 3, 6, 300, 64, seed=1)
    first = ext.attend_rows(q, k, v, ends, 0.125, use=0)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for use in range(ext.isa() + 1):
                assert torch.equal(ext.attend_rows(q, k, v, ends, 0.125, use=use), first)
    finally:
        torch.set_num_threads(threads)
    for b in range(2):
        for w in range(6):
            alone = ext.attend_rows(q[b : b + 1, :, w : w + 1], k[b : b + 1], v[b : b + 1], ends[b : b + 1, w : w + 1],
                                    0.125)
            assert torch.equal(alone, first[b : b + 1, :, w : w + 1])
    for h in range(9):  # one query head with its key/value head
        g = h // 3
        alone = ext.attend_rows(q[:, h : h + 1], k[:, g : g + 1], v[:, g : g + 1], ends, 0.125)
        assert torch.equal(alone, first[:, h : h + 1])


@pytest.mark.parametrize("scale", [1.0, 30.0], ids=["plain", "large"])
def test_the_norm_and_the_gated_product_compute_their_formulas_each_row_alone(ext, scale):
    gen = torch.Generator().manual_seed(4)
    x = scale * torch.randn(5, 3, 96, generator=gen)
    weight = torch.randn(96, generator=gen)
    want = weight.double() * x.double() / (x.double().pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    got = ext.norm(x, weight, 1e-5)
    torch.testing.assert_close(got.double(), want, atol=1e-5 * scale, rtol=1e-5)
    g, u = (scale * torch.randn(4, 2, 160, generator=gen) for _ in range(2))
    g_wide = torch.cat([g, torch.zeros_like(g)], -1)[..., :160]  # a view whose rows are 320 apart
    assert not g_wide.is_contiguous()
    want = torch.nn.functional.silu(g.double()) * u.double()
    torch.testing.assert_close(ext.silu_mul(g_wide, u).double(), want, atol=1e-6 * scale * scale, rtol=1e-5)
    for use in range(ext.isa() + 1):
        assert torch.equal(ext.norm(x, weight, 1e-5, use=use), got)
        assert torch.equal(ext.silu_mul(g, u, use=use), ext.silu_mul(g, u, use=0))
    assert torch.equal(ext.norm(x[2:3, 1:2], weight, 1e-5), got[2:3, 1:2])
    assert torch.equal(ext.silu_mul(g[1:2, :1], u[1:2, :1]), ext.silu_mul(g, u)[1:2, :1])


def test_bad_input_is_refused_in_one_line(ext):
    q, k, v, ends = _inputs(1, 4, 2, 2, 20, 16, seed=2)
    for args, says in (((q.double(), k, v, ends), "float32"), ((q, k, v, ends + 30), "beyond"),
                       ((q[..., :8], k[..., :8], v[..., :8], ends), "multiple of 16"),
                       ((q, k, v, ends.int()), "int64"), ((q[:, :3], k, v, ends), "multiple of the key/value")):
        with pytest.raises(RuntimeError, match=says) as err:
            ext.attend_rows(*args, 0.25)
        assert "\n" not in str(err.value).strip()
    x = torch.randn(2, 32)
    for call, says in ((lambda: ext.norm(x.double(), torch.ones(32), 1e-5), "float32"),
                       (lambda: ext.norm(x[:, :24], torch.ones(24), 1e-5), "multiple of 16"),
                       (lambda: ext.norm(x, torch.ones(16), 1e-5), "weight"),
                       (lambda: ext.silu_mul(x, x[:1]), "one shape")):
        with pytest.raises(RuntimeError, match=says) as err:
            call()
        assert "\n" not in str(err.value).strip()


@pytest.mark.parametrize("causal_blocks", [False, True])
def test_the_keys_each_query_sees_are_the_plans(ext, causal_blocks):
    """Exact layouts (committed tokens one by one, a prefill's prompt, a block, padding) and an open one: sbd's
    kernel over `query_ends` gives the dense mask's attention, and the real columns of torch's plan."""
    rows = [(9, 3, 1, False), (20, 6, 2, False), (0, 5, 5, True), (4, 2, 2, False)]
    width = 6
    q, k, v, _ = _inputs(len(rows), 4, 2, width, 30, 16, seed=3)
    q = q.contiguous()
    layout = exact_plan(rows, width, causal_blocks)
    ends = query_ends(layout, len(rows), width)
    got = attend(q, k, v, layout, None, ext, ends)
    mask = layout_mask(*zip(*[r[:3] for r in rows]), width, 30, causal_blocks)
    want = dense_reference(q, k, v, mask)
    torch_plan = attend(q, k, v, layout, None)
    for b, (_, n, _, _) in enumerate(rows):
        real = slice(width - n, width)
        torch.testing.assert_close(got[b, :, real], want[b, :, real], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[b, :, real], torch_plan[b, :, real], atol=1e-5, rtol=1e-5)
        assert (got[b, :, : width - n] == 0).all()
    open_ = uniform_plan(9, 0, 1, False, device=DEVICE)
    q1 = q[:, :, :1]
    assert query_ends(open_, len(rows), 1).tolist() == [[10]] * len(rows)
    torch.testing.assert_close(attend(q1, k, v, open_, None, ext, query_ends(open_, len(rows), 1)),
                               attend(q1, k, v, open_, None), atol=1e-5, rtol=1e-5)


def _int4(seed):
    model = _model.__wrapped__("llama", seed=seed, hidden=128, heads=2, kv_heads=1)  # head size 64
    attach_random_adapter(model, seed=seed)  # as `sbd.load` does: the adapter first, then the base quantized
    quantized.quantize(model, "int4")
    return model


def test_engines_attend_on_it_where_it_applies(ext, monkeypatch):
    model = _int4(31)
    assert ModelForward(model).lean.own is ext
    monkeypatch.setattr(own_kernels, "OWN", False)
    assert ModelForward(model).lean.own is None
    monkeypatch.setattr(own_kernels, "OWN", True)
    monkeypatch.setattr(extension, "loaded", lambda: None)  # not built yet: nothing waits for it
    assert ModelForward(model).lean.own is None
    monkeypatch.undo()
    odd = _model.__wrapped__("llama", seed=31, hidden=64, heads=8, kv_heads=2)  # head size 8
    assert ModelForward(odd).lean.own is None


def test_sbd_verify_keeps_ntp_tokens_on_it_and_only_rounding_moves(ext, monkeypatch):
    """Quantized weights, alone and batched at different lengths: sbd-verify's committed positions are NTP's bit
    for bit on sbd's kernel, through the C++ layers and the Python ones; torch's kernel moves the logits by rounding."""
    from sbd.decoding import native_layers

    model = _int4(32)
    runs = {}
    for own in (True, False):
        for native in (True, False):
            monkeypatch.setattr(own_kernels, "OWN", own)
            monkeypatch.setattr(extension, "wanted", lambda native=native: native)
            monkeypatch.setattr(native_layers, "OWN_UPDATE", False)
            for prompts in (random_prompts(3, 300, seed=33), random_prompts(1, 300, seed=34)):
                seen = []
                out = {m: sbd.generate(model, None, prompts, method=m, max_new_tokens=16, eos_token_ids=[], seed=0,
                                       observer=(lambda r: seen.append(r.logits.clone())) if m == "ntp" else None,
                                       **({"draft": "block", "block_size": 4} if m == "sbd-verify" else {}))
                       for m in ("ntp", "sbd-verify")}
                assert out["sbd-verify"].token_ids == out["ntp"].token_ids
                runs[own, native, len(prompts)] = (out["ntp"].token_ids, seen)
    for n in (3, 1):
        own_native, own_python = runs[True, True, n], runs[True, False, n]
        assert own_native[0] == own_python[0]
        assert all(torch.equal(a, b) for a, b in zip(own_native[1], own_python[1]))  # C++ and Python layers alike
        torchs = runs[False, True, n]
        assert torchs[0] == own_native[0]
        assert all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(own_native[1], torchs[1]))
        assert any(not torch.equal(a, b) for a, b in zip(own_native[1], torchs[1]))  # the kernels did differ
