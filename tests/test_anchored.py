"""Anchored plain SBD (`sbd.decoding.anchored`): the first token of every forward is the model's own next
token over an exact cache, γ = 0 is NTP decoding, the masks' tokens follow the bound, a row decodes the
same alone and in a batch, and the drafter's record decides whether it may run."""

from __future__ import annotations

import math

import pytest
import torch

import sbd
from sbd import SBDError
from sbd.drafters import adapter as adapters
from sbd.drafters import sampler_head as heads
from sbd.decoding.anchored import AnchoredRow
from sbd.decoding.spec import DecodeSpec

from conftest import _model, attach_random_adapter, hf_greedy, random_prompts
from test_sampler_head import attach_random_head


@pytest.fixture
def drafter():
    """The tiny llama with a random drafting adapter (the masks draft something) and, optionally, a head."""
    model = _model("llama")
    attach_random_adapter(model, seed=3)
    yield model
    if heads.head_of(model) is not None:
        heads.detach(model)
    adapters.detach(model)


def _causal_next(model, ids: list[int]) -> int:
    """The base model's greedy next token after `ids`, recomputed from scratch (no cache, adapter off)."""
    with torch.no_grad(), adapters.gated(model, None):
        return int(model(torch.tensor([ids], device=model.device)).logits[0, -1].argmax())


@pytest.mark.parametrize("head", [False, True])
def test_gamma_zero_is_ntp_decoding(drafter, head):
    if head:
        attach_random_head(drafter, seed=4, scale=3.0)
    prompts = random_prompts(3, drafter.config.vocab_size, seed=5)
    out = sbd.generate(drafter, None, prompts, method="sbd", anchor=True, gamma=0.0, block_size=4,
                       max_new_tokens=16)
    with adapters.gated(drafter, None):
        refs = [hf_greedy(drafter, p, 16) for p in prompts]
    assert out.token_ids == refs
    assert out.nfe == [len(t) for t in out.token_ids]


@pytest.mark.parametrize("head", [False, True])
def test_each_forward_starts_with_the_models_own_next_token(drafter, head, monkeypatch):
    """Several tokens per forward, and the first token of every forward equals a fresh causal
    recomputation over prompt + what came before: the cache holds exactly the committed tokens."""
    if head:
        attach_random_head(drafter, seed=6, scale=3.0)
    else:  # a random drafter's first mask never agrees with the head: make it agree, so masks' tokens are taken
        ask = AnchoredRow.ask

        def agreeing(row, logits, drafting=None):
            logits[1] = logits[0]
            return ask(row, logits, drafting)

        monkeypatch.setattr(AnchoredRow, "ask", agreeing)
    prompts = random_prompts(3, drafter.config.vocab_size, seed=7)
    out = sbd.generate(drafter, None, prompts, method="sbd", anchor=True, gamma=math.inf, block_size=4,
                       max_new_tokens=20)
    assert sum(map(len, out.token_ids)) > sum(out.nfe)  # masks' tokens were taken
    for prompt, ids, steps in zip(prompts, out.token_ids, out.steps):
        firsts = [i for i in range(len(ids)) if i == 0 or steps[i] != steps[i - 1]]
        assert len(firsts) == len(set(steps))
        for i in firsts:
            assert ids[i] == _causal_next(drafter, prompt + ids[:i])


def test_a_row_decodes_the_same_alone_and_in_a_batch(drafter):
    attach_random_head(drafter, seed=8, scale=3.0)
    prompts = random_prompts(4, drafter.config.vocab_size, seed=9)
    batch = sbd.generate(drafter, None, prompts, method="sbd", anchor=True, gamma=1.0, block_size=4,
                         max_new_tokens=18)
    for i, p in enumerate(prompts):
        alone = sbd.generate(drafter, None, [p], method="sbd", anchor=True, gamma=1.0, block_size=4,
                             max_new_tokens=18)
        assert (alone.token_ids[0], alone.nfe[0]) == (batch.token_ids[i], batch.nfe[i])
    fixed = sbd.generate(drafter, None, prompts, method="sbd", anchor=True, gamma=1.0, block_size=4,
                         max_new_tokens=18, static_shapes=True)  # padded to fixed widths: the same decoding
    assert (fixed.token_ids, fixed.nfe) == (batch.token_ids, batch.nfe)


def _answered(values, k=4, gamma=0.5):
    row = AnchoredRow(DecodeSpec(method="sbd", anchor=True, block_size=k, gamma=gamma, max_new_tokens=32), [5, 6], mask_id=1)
    row.answer([])  # the prefill
    row.feed()
    row.answer(values)
    return row.out


def test_the_masks_tokens_follow_the_entropy_bound_left_to_right():
    # next token 7; masks' argmax [7, 8, 9, 10] with entropies [., 0.2, 0.2, 0.2]: 0.2 + 0.2 <= 0.5 < 0.6
    assert _answered([7, 7, 8, 9, 10, 0.0, 0.2, 0.2, 0.2]) == [7, 8, 9]
    # a confident later mask does not jump an unsure earlier one (left to right)
    assert _answered([7, 7, 8, 9, 10, 0.0, 0.9, 0.0, 0.0]) == [7]
    # the first mask guessed another next token: the masks drafted after it, so only the head's token
    assert _answered([7, 3, 8, 9, 10, 0.0, 0.0, 0.0, 0.0]) == [7]
    assert _answered([7, 7, 8, 9, 10, 0.0, 0.0, 0.0, 0.0], gamma=math.inf) == [7, 8, 9, 10]


def test_what_the_drafter_records_decides_whether_it_runs(drafter):
    prompts = random_prompts(1, drafter.config.vocab_size, seed=11)
    adapters.adapter_of(drafter).config.trained_for = ["sbd-verify"]  # all-mask blocks: what anchored feeds
    sbd.generate(drafter, None, prompts, method="sbd", anchor=True, max_new_tokens=4)
    with pytest.raises(SBDError, match="not trained for plain SBD"):
        sbd.generate(drafter, None, prompts, method="sbd", max_new_tokens=4)
    adapters.adapter_of(drafter).config.trained_for = []
    with pytest.raises(SBDError, match="never trained"):
        sbd.generate(drafter, None, prompts, method="sbd", anchor=True, max_new_tokens=4)


@pytest.mark.parametrize("kw, words", [
    (dict(method="sbd-verify", anchor=True), "applies to method='sbd'"),
    (dict(method="sbd", anchor="yes"), "true or false"),
    (dict(method="sbd", anchor=True, proxy="margin"), "do not apply"),
    (dict(method="sbd", anchor=True, reveal_per_forward=2), "do not apply"),
])
def test_settings_anchor_does_not_take_are_refused(drafter, kw, words):
    with pytest.raises(SBDError, match=words):
        sbd.generate(drafter, None, [[5, 6, 7]], max_new_tokens=4, **kw)
