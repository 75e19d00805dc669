"""The conformance suite (issue: exact KV cache): every architecture × every exactness property.

1. every SBD forward's logits equal a from-scratch recompute without a cache;
2. after each commit the cache equals a plain causal prefill of the same tokens;
3. NTP decoding equals transformers' greedy `generate`;
4. γ = ∞ takes one forward per block, γ = 0 reveals one token per forward;
5. a batch of prompts of different lengths decodes row by row like each prompt alone.
"""

import math

import pytest
import torch
from transformers import DynamicCache

import sbd
from sbd.masks import causal_mask
from sbd.models.cache_arg import with_cache
from sbd.models.probe import probe_model

from conftest import blocks, random_prompts

TOL = 1e-4


class Recorder:
    """Keeps what the cache holds (tokens, positions) next to every forward the loop made."""

    def __init__(self):
        self.calls = []

    def __call__(self, record):
        self.calls.append(record)


def replay(records):
    """Yield (record, context ids, context positions) where the context is what the cache held
    before the call: the committed (causal) inputs of all earlier calls."""
    ctx_ids, ctx_pos = None, None
    for r in records:
        yield r, ctx_ids, ctx_pos
        ids, pos = r.input_ids[:, : r.n_commit], r.position_ids[:, : r.n_commit]
        ctx_ids = ids if ctx_ids is None else torch.cat([ctx_ids, ids], 1)
        ctx_pos = pos if ctx_pos is None else torch.cat([ctx_pos, pos], 1)


def test_probe_accepts_the_architecture(model):
    probe_model(model)


@pytest.mark.parametrize("gamma", [0.0, 0.35, math.inf])
def test_every_sbd_forward_equals_a_recompute_without_cache(model, gamma):
    rec = Recorder()
    prompt = random_prompts(1, model.config.vocab_size, lengths=(7,))
    sbd.generate(model, None, prompt, method="sbd", block_size=4, gamma=gamma, max_new_tokens=14,
                 eos_token_ids=[], observer=rec)
    block_calls = 0
    for r, ctx_ids, ctx_pos in replay(rec.calls):
        if ctx_ids is None:
            continue  # the prefill itself
        c, q = ctx_ids.shape[1], r.input_ids.shape[1]
        # The SPEC's mask, built here and not taken from the loop: context and committed tokens
        # causal, block positions see everything before them and each other.
        full_mask = causal_mask(torch.zeros(1, dtype=torch.long, device=model.device), c + q)
        full_mask[..., c + r.n_commit :, :] = True
        with torch.no_grad():
            fresh = model(input_ids=torch.cat([ctx_ids, r.input_ids], 1),
                          position_ids=torch.cat([ctx_pos, r.position_ids], 1),
                          attention_mask=full_mask).logits[:, -r.logits.shape[1]:]
        keep = torch.ones(fresh.shape[-1], dtype=torch.bool, device=model.device)
        keep[model.config.sbd_mask_token_id] = False  # the loop suppresses the mask token's logit
        assert (r.logits[..., keep] - fresh[..., keep]).abs().max() <= TOL
        block_calls += 1
    assert block_calls >= 4  # several blocks, several forwards each


def test_cache_after_each_commit_equals_a_causal_prefill(model):
    rec = Recorder()
    snapshots = []

    def observe(r):
        rec(r)
        if r.n_commit:
            snapshots.append([(k[None].clone(), v[None].clone()) for k, v in r.committed(0)])

    prompt = random_prompts(1, model.config.vocab_size, lengths=(5,))
    sbd.generate(model, None, prompt, method="sbd", block_size=4, gamma=0.35, max_new_tokens=16,
                 eos_token_ids=[], observer=observe)
    contexts = []
    for r, ctx_ids, ctx_pos in replay(rec.calls):
        if r.n_commit:
            ids, pos = r.input_ids[:, : r.n_commit], r.position_ids[:, : r.n_commit]
            contexts.append((ids if ctx_ids is None else torch.cat([ctx_ids, ids], 1),
                             pos if ctx_pos is None else torch.cat([ctx_pos, pos], 1)))
    assert len(contexts) == len(snapshots) == 4  # prefill + 3 commits (the last block is never committed)
    for (ids, pos), cached in zip(contexts, snapshots):
        ref = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids, position_ids=pos, **with_cache(model, ref), use_cache=True)
        for (k, v), layer in zip(cached, ref.layers):
            assert k.shape == layer.keys.shape
            assert (k - layer.keys).abs().max() <= TOL and (v - layer.values).abs().max() <= TOL


def test_ntp_equals_transformers_generate(model):
    for prompt in random_prompts(3, model.config.vocab_size, lengths=(4, 9, 1)):
        ours = sbd.generate(model, None, [prompt], method="ntp", max_new_tokens=24)
        with torch.no_grad():
            ids = torch.tensor([prompt], device=model.device)
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=24)[0, len(prompt):].tolist()
        eos = model.generation_config.eos_token_id
        if eos in ref:
            ref = ref[: ref.index(eos) + 1]
        assert ours.token_ids[0] == ref
        assert ours.nfe[0] == len(ref)


def test_nfe_follows_the_rule_at_gamma_inf_and_zero(model):
    prompt = random_prompts(1, model.config.vocab_size, lengths=(6,))
    full = sbd.generate(model, None, prompt, method="sbd", block_size=5, gamma=math.inf, max_new_tokens=23, eos_token_ids=[])
    assert full.nfe == [5]  # blocks of 5, 5, 5, 5, 3
    assert full.steps[0] == [1] * 5 + [2] * 5 + [3] * 5 + [4] * 5 + [5] * 3
    one = sbd.generate(model, None, prompt, method="sbd", block_size=5, gamma=0.0, max_new_tokens=23, eos_token_ids=[])
    assert one.nfe == [23]
    assert sorted(one.steps[0]) == list(range(1, 24))  # each forward revealed exactly one token
    for b in range(0, 23, 5):  # ... and only tokens of the block being decoded
        assert sorted(one.steps[0][b : b + 5]) == list(range(b + 1, min(b + 5, 23) + 1))


def test_revealed_tokens_are_fed_back_into_the_block(model):
    rec = Recorder()
    prompt = random_prompts(1, model.config.vocab_size, lengths=(6,))
    out = sbd.generate(model, None, prompt, method="sbd", block_size=4, gamma=0.0, max_new_tokens=12, eos_token_ids=[],
                       observer=rec)
    mask_id = model.config.sbd_mask_token_id
    block_calls = rec.calls[1:]
    assert len(block_calls) == 12
    for j, r in enumerate(block_calls):
        start, seen = (j // 4) * 4, j % 4  # block start in the output; forwards already made in this block
        block_in = r.input_ids[0, -4:].tolist()
        revealed = [i for i, t in enumerate(block_in) if t != mask_id]
        assert len(revealed) == seen
        assert all(block_in[i] == out.token_ids[0][start + i] for i in revealed)
        if j and seen == 0:  # first forward of a block commits the previous block's tokens
            assert r.input_ids[0, :4].tolist() == out.token_ids[0][start - 4 : start]


@pytest.mark.parametrize("method,gamma", [("ntp", 0.0), ("sbd", 0.0), ("sbd", 0.35), ("sbd", 1.0), ("sbd", math.inf)])
def test_batch_decodes_each_row_as_if_alone(model, method, gamma):
    prompts = random_prompts(5, model.config.vocab_size, seed=3)
    kw = dict(method=method, **blocks(method, 4), max_new_tokens=30, **({"gamma": gamma} if method == "sbd" else {}))
    # Make a token that the first row produces mid-way the EOS, so that rows stop at different times.
    free = sbd.generate(model, None, prompts[:1], eos_token_ids=[], **kw)
    eos = [free.token_ids[0][9]]
    batch = sbd.generate(model, None, prompts, eos_token_ids=eos, **kw)
    assert len({len(t) for t in batch.token_ids}) > 1
    for i, p in enumerate(prompts):
        alone = sbd.generate(model, None, [p], eos_token_ids=eos, **kw)
        assert batch.token_ids[i] == alone.token_ids[0]
        assert batch.nfe[i] == alone.nfe[0]
        assert batch.steps[i] == alone.steps[0]
