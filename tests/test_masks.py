"""Masks against the SPEC's rules written out as explicit loops."""

import pytest
import torch

from sbd.masks import causal_mask, inference_mask, training_mask


def naive_training_mask(n, k):
    m = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    for q in range(2 * n):
        for kv in range(2 * n):
            if q < n and kv < n:
                m[q, kv] = kv <= q
            elif q >= n and kv >= n:
                m[q, kv] = (q - n) // k == (kv - n) // k
            elif q >= n and kv < n:
                m[q, kv] = kv < ((q - n) // k) * k
    return m


@pytest.mark.parametrize("n,k", [(1, 1), (5, 2), (16, 4), (17, 16), (33, 7), (8, 16)])
def test_training_mask_matches_the_rules(n, k):
    m = training_mask(n, k)
    assert m.shape == (2 * n, 2 * n) and m.dtype == torch.bool
    assert torch.equal(m, naive_training_mask(n, k))


def test_clean_half_is_causal_and_never_sees_noise():
    m = training_mask(12, 4)
    assert torch.equal(m[:12, :12], torch.ones(12, 12, dtype=torch.bool).tril())
    assert not m[:12, 12:].any()


def naive_inference_mask(pad, past, n_causal, n_block):
    q_len = n_causal + n_block
    m = torch.zeros(len(pad), 1, q_len, past + q_len, dtype=torch.bool)
    for b, p in enumerate(pad):
        for q in range(q_len):
            for kv in range(past + q_len):
                if kv == past + q:
                    m[b, 0, q, kv] = True  # every query sees itself
                elif kv < p:
                    continue  # left padding is never attended
                elif q < n_causal:
                    m[b, 0, q, kv] = kv <= past + q
                else:
                    m[b, 0, q, kv] = True
    return m


@pytest.mark.parametrize("past,n_causal,n_block", [(0, 6, 0), (6, 0, 4), (6, 3, 4), (9, 4, 4), (4, 0, 1)])
def test_inference_mask_matches_the_rules(past, n_causal, n_block):
    pad = torch.tensor([0, 2, 5])
    assert torch.equal(inference_mask(pad, past, n_causal, n_block), naive_inference_mask(pad.tolist(), past, n_causal, n_block))


def test_no_attention_row_is_empty_even_for_padding():
    m = causal_mask(torch.tensor([0, 3, 5]), 5)
    assert m.any(-1).all()
