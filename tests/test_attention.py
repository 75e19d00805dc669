"""The engine's attention path (`sbd.decoding.attention`): every plan computes what the dense mask says,
and routing the model's attention through it changes no token, logit or forward count."""

import math

import pytest
import torch
import torch.nn.functional as F

import sbd
from sbd.decoding import engine
from sbd.decoding.attention import StepLayout, attend, rows_plan, uniform_plan
from sbd.decoding.forward import ModelForward, columns, step_mask

from conftest import DEVICE, attach_random_adapter, blocks, random_prompts


def dense_reference(q, k, v, mask):
    """What Hugging Face's SDPA path computes from the dense mask: key/value heads copied per query head."""
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask)


def qkv(b, w, s, heads=4, kv_heads=2, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, w, d, generator=gen, device="cpu").to(DEVICE)
    k = torch.randn(b, kv_heads, s, d, generator=gen, device="cpu").to(DEVICE)
    v = torch.randn(b, kv_heads, s, d, generator=gen, device="cpu").to(DEVICE)
    return q, k, v


def layout_mask(lengths, real, commits, width, visible, causal_blocks):
    L, n, c = (torch.tensor(x, device=DEVICE) for x in (lengths, real, commits))
    return step_mask(L, n, c, width, visible, columns(n, width), causal_blocks)


@pytest.mark.parametrize("shared_mask", [True, False])
@pytest.mark.parametrize("causal_blocks", [False, True])
@pytest.mark.parametrize("length,commit,width", [(0, 5, 5), (9, 0, 1), (9, 1, 1), (9, 0, 6), (9, 1, 6), (9, 3, 6),
                                                 (9, 6, 6), (30, 2, 17)])
def test_uniform_plans_equal_the_dense_mask(length, commit, width, causal_blocks, shared_mask):
    """Rows sharing one cache length: "open" needs no mask, "split" one (1, 1, W, S) mask for all rows (or,
    as CUDA runs it, two calls: the committed rows lower-right causal, the block rows unmasked); both give
    the dense mask's attention, with and without causal blocks."""
    b, spare = 3, 4  # the cache view may hold positions past the fed tokens (scratch): the plan ignores them
    q, k, v = qkv(b, width, length + width + spare)
    layout = uniform_plan(length, commit, width, causal_blocks, device=DEVICE)
    if not shared_mask:
        layout.mask = None
    assert layout.plan == ("open" if width == 1 or (commit == 0 and not causal_blocks) else "split")
    mask = layout_mask([length] * b, [width] * b, [commit] * b, width, length + width, causal_blocks)
    want = dense_reference(q, k[:, :, : length + width], v[:, :, : length + width], mask)
    torch.testing.assert_close(attend(q, k, v, layout, None), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fold", [1, 2])
@pytest.mark.parametrize("causal_blocks", [False, True])
def test_rows_plan_equals_the_dense_mask(fold, causal_blocks):
    """Rows at different lengths, with padding: one per-row mask, key/value heads never copied (fold 2 is
    what CUDA runs: each head's group of queries folded into the query length, an additive mask)."""
    lengths, real, commits, width = [4, 11, 0], [3, 7, 5], [1, 2, 5], 7
    visible = max(a + b for a, b in zip(lengths, real))
    q, k, v = qkv(3, width, visible)
    mask = layout_mask(lengths, real, commits, width, visible, causal_blocks)
    layout = rows_plan(mask, fold, q.dtype)
    torch.testing.assert_close(attend(q, k, v, layout, None), dense_reference(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_a_layout_past_the_cache_is_refused():
    q, k, v = qkv(1, 4, 6)
    with pytest.raises(ValueError, match="cache holds 6"):
        attend(q, k, v, StepLayout("split", length=5, n_commit=1, width=4), None)
    with pytest.raises(ValueError, match="impossible"):
        uniform_plan(3, 5, 4, False)


def _real_columns(rec) -> torch.Tensor:
    """A forward's logits with its padding columns zeroed: they carry nothing (the "exact" plan leaves them
    unattended, the dense mask attends them somewhere), only the rows' real tokens are read."""
    got = rec.logits.float().cpu().clone()
    if got.shape[1] == rec.input_ids.shape[1]:
        for i, real in enumerate(rec.reals):
            got[i, : got.shape[1] - real] = 0
    return got


def _run(model, attention, prompts, causal_blocks=False, **kw):
    """Tokens, forwards and every forward's logits, with the engine's attention set to `attention`."""
    logits, plans = [], []
    original = engine.Engine.step

    def step(self):
        done = original(self)
        plans.append(dict(self.plans))
        return done

    try:
        engine.Engine.step = step
        r = sbd.generate(model, None, prompts, observer=lambda rec: logits.append(_real_columns(rec)),
                         eos_token_ids=[], max_new_tokens=21,
                         engine={"attention": attention, "causal_blocks": causal_blocks}, **kw)
    finally:
        engine.Engine.step = original
    return r, logits, plans[-1] if plans else {}


CASES = [("ntp", {}), ("sbd", {"gamma": 0.35}), ("sbd", {"gamma": math.inf}), ("sbd-verify", {}),
         ("sbd-verify", {"draft": "block", "lookup": False, "tree": (2, 2)}), ("sbd", {"anchor": True, "gamma": 0.5})]


@pytest.mark.filterwarnings("ignore:sbd. this model records no training")
@pytest.mark.parametrize("method,kw", CASES)
@pytest.mark.parametrize("batch", [1, 4])
def test_routed_attention_changes_no_token(model, method, kw, batch):
    """The same tokens, forwards and (to float rounding) logits as the dense mask, alone and in ragged
    batches; alone, no forward needs a per-row mask; a tree or a ragged batch takes the "rows" plan; on
    row-invariant layers every forward but a tree's takes the "exact" plan."""
    prompts = random_prompts(batch, model.config.vocab_size)
    a, la, plans_a = _run(model, "dense", prompts, method=method, **blocks(method, 4), **kw)
    b, lb, plans_b = _run(model, "auto", prompts, method=method, **blocks(method, 4), **kw)
    assert a.token_ids == b.token_ids and a.nfe == b.nfe and a.steps == b.steps
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
    assert set(plans_a) == {"dense"} and "dense" not in plans_b
    if ModelForward(model).exact and "tree" not in kw:  # row-invariant layers (sbd's float32 product on a CPU)
        assert set(plans_b) == {"exact"}
    elif batch == 1 and "tree" not in kw:
        assert set(plans_b) <= {"open", "split"}
    else:
        assert plans_b.get("rows", 0) > 0


def test_routed_attention_with_an_adapter_and_causal_blocks(llama):
    """A drafting adapter (gated per row) and causal blocks ride the same path: tokens as with the dense mask."""
    attach_random_adapter(llama)
    try:
        prompts = random_prompts(3, llama.config.vocab_size)
        kw = dict(method="sbd-verify", block_size=4, draft="block", lookup=False, causal_blocks=True)
        a, _, _ = _run(llama, "dense", prompts, **kw)
        b, _, plans = _run(llama, "auto", prompts, **kw)
        assert a.token_ids == b.token_ids and a.nfe == b.nfe and plans
    finally:
        from sbd.drafters import adapter as adapters

        adapters.detach(llama)


def test_the_model_is_left_on_its_own_attention(llama):
    """Routing is scoped to the engine's calls: Hugging Face's own forwards see SDPA afterwards."""
    sbd.generate(llama, None, random_prompts(1, llama.config.vocab_size), max_new_tokens=4)
    assert llama.config._attn_implementation == "sdpa"


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA's flash kernel (the GPU run checks it)")
@pytest.mark.parametrize("causal_blocks", [False, True])
def test_the_flash_kernels_lower_right_causal_equals_the_dense_mask_on_cuda(causal_blocks):
    """On CUDA in half precision the split plan's causal parts run the flash kernel directly, with its
    lower-right alignment and shared key/value heads: the dense mask's attention, to bf16 rounding."""
    length, commit, width, b = 300, 3, 17, 2
    q, k, v = (x.to(torch.bfloat16) for x in qkv(b, width, length + width, heads=8, kv_heads=2, d=64))
    layout = uniform_plan(length, commit, width, causal_blocks, flash=True)
    mask = layout_mask([length] * b, [width] * b, [commit] * b, width, length + width, causal_blocks)
    want = dense_reference(q.float(), k.float(), v.float(), mask)
    torch.testing.assert_close(attend(q, k, v, layout, None).float(), want, atol=2e-2, rtol=2e-2)


def test_the_engine_options_of_generate_are_checked(model):
    from sbd.errors import SBDError

    with pytest.raises(SBDError, match="engine takes"):
        sbd.generate(model, None, [[5, 6, 7]], method="ntp", max_new_tokens=2, engine={"attention": "dense", "x": 1})
    with pytest.raises(SBDError, match="unknown attention"):
        sbd.generate(model, None, [[5, 6, 7]], method="ntp", max_new_tokens=2, engine={"attention": "flat"})
