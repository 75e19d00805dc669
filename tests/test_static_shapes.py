"""`static_shapes=True`: every decoding forward padded to a fixed width over a fixed-size cache (what
`torch.compile` / CUDA graphs need) gives exactly the tokens, forwards and reveal steps of the default
path, alone and in ragged batches whose rows stop at different times."""

import math

import pytest
import torch

import sbd

from conftest import random_prompts

CASES = [("ntp", {}), ("sbd", {"gamma": 0.0}), ("sbd", {"gamma": 0.35}), ("sbd", {"gamma": math.inf}),
         ("sbd-verify", {}), ("sbd-verify", {"draft": "eb", "gamma": 0.35})]


@pytest.mark.parametrize("method,kw", CASES)
@pytest.mark.parametrize("block_size", [4, 5])
def test_static_shapes_change_nothing(model, method, kw, block_size):
    prompts = random_prompts(5, model.config.vocab_size)
    a = sbd.generate(model, None, prompts, method=method, block_size=block_size, max_new_tokens=23, **kw)
    b = sbd.generate(model, None, prompts, method=method, block_size=block_size, max_new_tokens=23,
                     static_shapes=True, **kw)
    assert a.token_ids == b.token_ids and a.nfe == b.nfe and a.steps == b.steps


def test_static_forwards_have_few_shapes(llama):
    """Apart from the prefill, an SBD run feeds only widths k and 2k, over the same cache size."""
    shapes = []
    sbd.generate(llama, None, random_prompts(3, llama.config.vocab_size), method="sbd", block_size=4, gamma=0.35,
                 max_new_tokens=22, static_shapes=True, eos_token_ids=[],
                 observer=lambda r: shapes.append((r.input_ids.shape[1], r.attention_mask.shape[-1])))
    decode = shapes[1:]
    assert {w for w, _ in decode} == {4, 8} and len({kv for _, kv in decode}) == 1


def test_static_logits_equal_dynamic_logits(llama):
    """Dead padding tokens are invisible: the logits of every forward agree with the default path."""
    got = {True: [], False: []}
    prompts = random_prompts(2, llama.config.vocab_size)
    for static in (False, True):
        sbd.generate(llama, None, prompts, method="sbd", block_size=5, gamma=0.35, max_new_tokens=13,
                     static_shapes=static, eos_token_ids=[], observer=lambda r, s=static: got[s].append(r.logits.clone()))
    assert len(got[True]) == len(got[False])
    for a, b in zip(got[False], got[True]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
