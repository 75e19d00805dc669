"""The engine's scheduler under random traffic: rows join, leave (a client hangs up) and step in any order.

A seeded random sequence of joins, cancels and steps, on tiny models of the four architectures, for every
method and both prefill modes. After every step each live row's cache slot holds exactly a causal prefill
of its own committed tokens, and every row that finished equals the same prompt decoded alone. This is the
test that the cross-request contamination of issue 26 (a leave and a join between the same two steps
reordered rows without their caches) would have failed.
"""

import os
import random

import pytest
import torch
from transformers import DynamicCache

from sbd.decoding.engine import Engine
from sbd.decoding.kinds import make_row
from sbd.decoding.spec import DecodeSpec
from sbd.models.cache_arg import with_cache

from conftest import attach_random_adapter, _model

SEQUENCES = int(os.environ.get("SBD_SCHEDULER_SEQUENCES", "16"))  # per architecture and prefill mode
METHODS = [("ntp", {}), ("sbd", {"gamma": 0.35}), ("sbd-verify", {}),
           ("sbd-verify", {"draft": "adaptive", "cost": lambda w: 1 + 0.08 * w}),
           ("sbd-verify", {"lookup": True, "lookup_max": 8})]
BLOCK = 4  # lookup drafts up to 8 tokens, longer than a block, in a forward no wider than 2 · BLOCK + 1


def _new_row(model, rng: random.Random, vocab: int):
    method, kw = METHODS[rng.randrange(len(METHODS))]
    temperature = 0.0 if (kw or rng.random() < 0.6) else 1.0  # adaptive and lookup are greedy only
    prompt = [rng.randrange(3, vocab) for _ in range(rng.choice([1, 2, 3, 5, 8, 13]))]
    spec = dict(method=method, prompt=prompt, max_new=rng.randrange(1, 20), temperature=temperature,
                seed=rng.randrange(1 << 30), kw=kw)
    return spec, _make(model, spec)


def _make(model, spec):
    eos = [model.config.eos_token_id]
    kw = dict(spec["kw"])
    cost = kw.pop("cost", None)
    decode = DecodeSpec(method=spec["method"], block_size=BLOCK, max_new_tokens=spec["max_new"],
                        temperature=spec["temperature"], **kw)
    return make_row(decode, spec["prompt"], mask_id=model.config.sbd_mask_token_id, eos=eos, seed=spec["seed"],
                    cost=cost)


def _alone(model, spec):
    row = _make(model, spec)
    engine = Engine(model, slots=1, capacity=64, max_width=2 * BLOCK + 1)
    engine.add(row)
    while engine.live:
        engine.step()
    return row


class CacheWatch:
    """Follows the engine's forwards: which tokens each row holds committed, and a copy of the keys and
    values its slot held after its last commit. A row's committed prefix must never change under it."""

    def __init__(self):
        self.context: dict[int, list[int]] = {}
        self.snap: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def __call__(self, record):
        for i, row in enumerate(record.rows):
            kept = self.context.get(id(row), [])[: record.lengths[i]]
            real = record.input_ids[i, record.input_ids.shape[1] - record.reals[i]:]
            self.context[id(row)] = kept + real[: record.commits[i]].tolist()
            now = record.committed(i)
            self.same(id(row), now, record.lengths[i])
            self.snap[id(row)] = [(k.clone(), v.clone()) for k, v in now]

    def same(self, key: int, kv, n: int) -> None:
        """The first n committed positions in `kv` are those this row's slot held before."""
        for (k, v), (k0, v0) in zip(kv, self.snap.get(key, [])):
            assert torch.equal(k[:, :n], k0[:, :n]) and torch.equal(v[:, :n], v0[:, :n]), \
                "a row's committed cache changed under it (it was moved without its cache)"

    def check_live(self, engine) -> None:
        """After a step: every live row's slot still holds what that row committed."""
        for i, row in enumerate(engine.rows):
            n = engine.lengths[i]
            if n:
                self.same(id(row), [(layer._k[i], layer._v[i]) for layer in engine.cache.layers], n)

    def check_prefill(self, model, row, n: int) -> None:
        """The row's committed keys and values equal a causal prefill of its committed tokens."""
        if not n:
            return
        ids = self.context[id(row)][:n]
        assert len(ids) == n
        ref = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids], device=model.device), **with_cache(model, ref), use_cache=True)
        for (k, v), want in zip(self.snap[id(row)], ref.layers):
            assert (k[:, :n] - want.keys[0]).abs().max() <= 1e-4 and (v[:, :n] - want.values[0]).abs().max() <= 1e-4


def _traffic(model, prefill: str, seed: int):
    """One random sequence of joins, cancels and steps; returns (spec, row) of every row that finished."""
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    watch = CacheWatch()
    engine = Engine(model, slots=4, capacity=64, max_width=2 * BLOCK + 1, prefill=prefill, observer=watch)
    joined, committed = [], {}

    def step():
        lengths = dict(zip(map(id, engine.rows), engine.lengths))
        for row in engine.step():
            committed[id(row)] = lengths[id(row)]  # before its last forward: a lower bound is enough
        watch.check_live(engine)

    for _ in range(rng.randrange(8, 30)):
        while engine.live < engine.slots and rng.random() < 0.45:
            spec, row = _new_row(model, rng, vocab)
            engine.add(row)
            joined.append((spec, row))
        if engine.live and rng.random() < 0.2:  # a client hangs up
            i = rng.randrange(engine.live)
            committed[id(engine.rows[i])] = engine.lengths[i]
            engine.remove(engine.rows[i])
        step()
    while engine.live:
        step()
    for spec, row in joined:
        watch.check_prefill(model, row, committed.get(id(row), 0))
    return [(s, r) for s, r in joined if r.finished]


@pytest.mark.parametrize("prefill", ["separate", "mixed"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_random_joins_leaves_and_steps_keep_every_row_on_its_own_cache(arch, prefill):
    model = _model(arch, seed=3)
    attach_random_adapter(model, seed=1)
    try:
        checked = 0
        with torch.inference_mode():
            for seed in range(SEQUENCES):
                for spec, row in _traffic(model, prefill, seed):
                    alone = _alone(model, spec)
                    assert row.out == alone.out, f"sequence {seed}: {spec['method']} row differs from alone"
                    assert row.nfe == alone.nfe and row.steps == alone.steps
                    checked += 1
        assert checked >= SEQUENCES  # the traffic really finishes rows
    finally:
        from sbd.drafters import adapter as adapters

        adapters.detach(model)
