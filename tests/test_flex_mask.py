"""The CUDA training mask, checked on CPU: flex_attention's forward runs on CPU (its backward does not),
so the BlockMask the trainer builds on CUDA is compared with SDPA under the collator's dense mask."""

from __future__ import annotations

import pytest
import torch

from sbd.training.collator import SBDDataCollator
from sbd.training.flex import training_block_mask


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("align,k", [(False, 4), (True, 3)])
def test_flex_block_mask_equals_dense_mask_under_attention(align, k):
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    c = SBDDataCollator(mask_token_id=99, eos_token_id=2, block_size=k, align_to_completion=align)
    feats = [{"input_ids": [5 + (i * j) % 90 for j in range(n - 1)] + [2], "prompt_length": p}
             for i, (n, p) in enumerate(((37, 5), (21, 3), (30, 9)))]
    clean = c.pad(feats)
    m = c.noisy_length(clean, k)
    g = torch.Generator().manual_seed(0)
    batch = c.corrupt(clean, k, torch.full((3,), 0.5), torch.rand(3, m, generator=g))
    dense = batch["attention_mask"]                                   # (B,1,T,T) bool
    n = batch["num_clean"]
    block = training_block_mask(clean["lengths"], c._origins(clean), c.noisy_lengths(clean, k), n, m, k, "cpu")
    b, t = dense.shape[0], dense.shape[-1]
    q, key, v = (torch.randn(b, 2, t, 16, generator=g) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, key, v, attn_mask=dense)
    out = flex.flex_attention(q, key, v, block_mask=block)
    assert (out - ref).abs().max() <= 1e-5
    # the test can fail: the same attention with the noisy→clean rule off differs
    wrong = dense.clone()
    wrong[:, :, n:, :n] = False
    wrong.diagonal(dim1=-2, dim2=-1).fill_(True)
    assert (torch.nn.functional.scaled_dot_product_attention(q, key, v, attn_mask=wrong) - out).abs().max() > 1e-3
