"""One-query attention with the query heads folded by key/value head (`sbd.decoding.attention._sdpa` on a
CPU) against SDPA's `enable_gqa`, as every one-token attention ran before: one SmolLM2 + its drafter, the
two settings taking turns prompt by prompt (8 prompts, twice, after a warm-up call each), NTP and
sbd-verify with their defaults. The two round differently, so tokens may part where two logits tie.

    python benchmarks/probes/one_query_fold.py int4 chat      # or float32, int8; chat or gsm
"""

from __future__ import annotations

import sys

import torch.nn.functional as F

import sbd.decoding.attention as attention
from turns import patched_turns

FOLDED = attention._sdpa


def with_gqa(q, k, v, scale, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def main(fmt: str, which: str) -> None:
    patched_turns(attention, "_sdpa", {"enable_gqa": with_gqa, "folded": FOLDED}, fmt, which)


if __name__ == "__main__":
    main(*sys.argv[1:3])
