"""Per-row progress (SPEC §7): a row's tokens, forwards and reveal steps never depend on the other rows,
whatever joins or leaves around it, and its cache is a causal prefill of its own committed tokens.

Tiny random models with decisive logits on the four architectures; every comparison is exact."""

import math

import pytest
import torch
from transformers import DynamicCache

import sbd
from sbd.decoding.engine import Engine
from sbd.decoding.proposers.eb import eb_rule
from sbd.decoding.rows import NTPRow, SBDRow, VerifyRow
from sbd.decoding.spec import DecodeSpec
from sbd.errors import SBDError
from sbd.models.cache_arg import with_cache
from sbd.sampler import reveal_from_proxy

from conftest import blocks, random_prompts

CASES = [("ntp", {}), ("sbd", {"gamma": 0.0}), ("sbd", {"gamma": 0.35}), ("sbd", {"gamma": math.inf}),
         ("sbd", {"gamma": 0.35, "proxy": "margin"}), ("sbd-verify", {}), ("sbd-verify", {"draft": "eb", "gamma": 0.35})]


def _eos_for_ragged_stops(model, prompts, **kw):
    """An EOS id that the first prompt produces early, so rows stop at different times."""
    free = sbd.generate(model, None, prompts[:1], eos_token_ids=[], **kw)
    return [free.token_ids[0][5]]


def _alone(model, prompts, seeds=None, **kw):
    outs = []
    for i, p in enumerate(prompts):
        seed = None if seeds is None else [seeds[i]]
        outs.append(sbd.generate(model, None, [p], seed=seed, **kw))
    return outs


@pytest.mark.parametrize("method,kw", CASES)
def test_batch_equals_alone_greedy(model, method, kw):
    prompts = random_prompts(5, model.config.vocab_size, seed=11)
    kw = dict(method=method, **blocks(method, 4), max_new_tokens=24, **kw)
    eos = _eos_for_ragged_stops(model, prompts, **kw)
    batch = sbd.generate(model, None, prompts, eos_token_ids=eos, **kw)
    assert len({len(t) for t in batch.token_ids}) > 1  # rows really stop at different times
    for i, one in enumerate(_alone(model, prompts, eos_token_ids=eos, **kw)):
        assert batch.token_ids[i] == one.token_ids[0]
        assert batch.nfe[i] == one.nfe[0] and batch.steps[i] == one.steps[0]
        assert batch.accepted[i] == one.accepted[0]


@pytest.mark.parametrize("method,kw", [("ntp", {}), ("sbd", {"gamma": 0.35}), ("sbd", {"gamma": math.inf}),
                                       ("sbd-verify", {})])
def test_batch_equals_alone_seeded_sampling(model, method, kw):
    prompts = random_prompts(4, model.config.vocab_size, seed=12)
    seeds = [5, 17, 5, 99]
    kw = dict(method=method, **blocks(method, 4), max_new_tokens=20, temperature=1.0, eos_token_ids=[], **kw)
    batch = sbd.generate(model, None, prompts, seed=seeds, **kw)
    for i, one in enumerate(_alone(model, prompts, seeds, **kw)):
        assert batch.token_ids[i] == one.token_ids[0] and batch.nfe[i] == one.nfe[0]


def test_an_int_seed_gives_each_row_its_own_stream(llama):
    p = random_prompts(1, llama.config.vocab_size)[0]
    out = sbd.generate(llama, None, [p, p], method="ntp", temperature=1.0, seed=3, max_new_tokens=16,
                       eos_token_ids=[])
    assert out.token_ids[0] != out.token_ids[1]  # same prompt, rows seeded 3 and 4
    assert out.token_ids[1] == sbd.generate(llama, None, [p], method="ntp", temperature=1.0, seed=4,
                                            max_new_tokens=16, eos_token_ids=[]).token_ids[0]
    with pytest.raises(SBDError, match="seed must be"):
        sbd.generate(llama, None, [p, p], method="sbd", temperature=1.0, seed=[1])


def _row(method, prompt, model, *, max_new, temperature, seed):
    spec = DecodeSpec(method=method, block_size=4, gamma=0.35, max_new_tokens=max_new, temperature=temperature)
    kind = {"ntp": NTPRow, "sbd": SBDRow, "sbd-verify": VerifyRow}[method]
    return kind(spec, prompt, mask_id=model.config.sbd_mask_token_id, seed=seed)


@pytest.mark.parametrize("prefill", ["separate", "mixed"])
def test_rows_joining_and_leaving_mid_flight_decode_as_alone(model, prefill):
    """Rows of all three methods, with their own budgets and temperatures, join at different steps;
    some leave early. Each equals the same row decoded alone."""
    prompts = random_prompts(7, model.config.vocab_size, lengths=(3, 11, 6, 1, 17, 2, 9), seed=13)
    plan = [("ntp", 0, 20, 0.0), ("sbd-verify", 0, 9, 0.0), ("sbd", 2, 16, 0.0), ("sbd-verify", 3, 24, 1.0),
            ("ntp", 3, 5, 1.0), ("sbd", 5, 21, 1.0), ("sbd-verify", 9, 13, 0.0)]
    rows = [_row(m, p, model, max_new=n, temperature=t, seed=40 + i)
            for i, ((m, _, n, t), p) in enumerate(zip(plan, prompts))]
    engine = Engine(model, slots=4, capacity=64, max_width=9, prefill=prefill)
    waiting, step, seen_full = list(zip(plan, rows)), 0, False
    with torch.inference_mode():
        while waiting or engine.live:
            while waiting and waiting[0][0][1] <= step and engine.live < engine.slots:
                engine.add(waiting.pop(0)[1])
            seen_full |= engine.live == engine.slots
            engine.step()
            step += 1
    assert seen_full
    for (m, _, n, t), p, row in zip(plan, prompts, rows):
        alone = _row(m, p, model, max_new=n, temperature=t, seed=40 + rows.index(row))
        solo = Engine(model, slots=1, capacity=64, max_width=9)
        with torch.inference_mode():
            solo.add(alone)
            while solo.live:
                solo.step()
        assert row.finished and row.out == alone.out and row.nfe == alone.nfe and row.steps == alone.steps


@pytest.mark.parametrize("method", ["sbd", "sbd-verify"])
def test_each_rows_cache_equals_a_causal_prefill_of_its_tokens(model, method):
    """After every forward, each row's committed cache equals a plain causal prefill of its own prompt and
    committed tokens (rows at different lengths in one batch; rejected drafts leave again)."""
    prompts = random_prompts(3, model.config.vocab_size, lengths=(4, 9, 2), seed=14)
    context: dict[int, list[int]] = {}
    checks = []

    def observe(r):
        for i, row in enumerate(r.rows):
            kept = context.get(id(row), [])[: r.lengths[i]]  # what the cache held before: drops applied
            real = r.input_ids[i, r.input_ids.shape[1] - r.reals[i]:]
            context[id(row)] = kept + real[: r.commits[i]].tolist()
            if r.commits[i]:
                checks.append((list(context[id(row)]), [(k.clone(), v.clone()) for k, v in r.committed(i)]))

    sbd.generate(model, None, prompts, method=method, **blocks(method, 4), max_new_tokens=18, eos_token_ids=[],
                 observer=observe)
    assert len(checks) > 10
    for ids, cached in checks:
        ref = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=torch.tensor([ids], device=model.device), **with_cache(model, ref), use_cache=True)
        for (k, v), layer in zip(cached, ref.layers):
            assert (k - layer.keys[0]).abs().max() <= 1e-4 and (v - layer.values[0]).abs().max() <= 1e-4


def test_host_eb_rule_equals_the_tensor_rule():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        k = int(torch.randint(1, 9, (1,), generator=g))
        h = torch.rand(k, generator=g) * 0.4
        h[torch.rand(k, generator=g) < 0.3] = 0.05  # ties
        masked = torch.rand(k, generator=g) < 0.7
        masked[int(torch.randint(0, k, (1,), generator=g))] = True
        gamma = float(torch.rand(1, generator=g)) * 0.5
        for order in (None, torch.rand(k, generator=g)):
            want = reveal_from_proxy(h[None], masked[None], gamma, None if order is None else order[None])[0]
            got = eb_rule(h.double().tolist(), masked.tolist(), gamma, None if order is None else order.double().tolist())
            assert sorted(got) == want.nonzero().squeeze(1).tolist()


def test_a_full_engine_and_an_oversized_row_are_refused(llama):
    engine = Engine(llama, slots=1, capacity=16)
    engine.add(NTPRow(DecodeSpec(method="ntp", max_new_tokens=4), [5, 6]))
    with pytest.raises(SBDError, match="full"):
        engine.add(NTPRow(DecodeSpec(method="ntp", max_new_tokens=4), [5, 6]))
    with pytest.raises(SBDError, match="cache positions"):
        Engine(llama, slots=2, capacity=16).add(NTPRow(DecodeSpec(method="ntp", max_new_tokens=10), [5] * 10))
