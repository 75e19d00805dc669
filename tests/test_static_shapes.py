"""`static_shapes=True`: every decoding forward padded to a fixed width over a fixed-size cache (what
`torch.compile` / CUDA graphs need) gives exactly the tokens, forwards and reveal steps of the default
path, alone and in ragged batches whose rows stop at different times."""

import math
import shutil

import pytest
import torch

import sbd

from conftest import DEVICE, attach_random_adapter, blocks, random_prompts

CASES = [("ntp", {}), ("sbd", {"gamma": 0.0}), ("sbd", {"gamma": 0.35}), ("sbd", {"gamma": math.inf}),
         ("sbd-verify", {}), ("sbd-verify", {"draft": "eb", "gamma": 0.35})]


@pytest.mark.parametrize("method,kw", CASES)
@pytest.mark.parametrize("block_size", [4, 5])
def test_static_shapes_change_nothing(model, method, kw, block_size):
    prompts = random_prompts(5, model.config.vocab_size)
    a = sbd.generate(model, None, prompts, method=method, **blocks(method, block_size), max_new_tokens=23, **kw)
    b = sbd.generate(model, None, prompts, method=method, **blocks(method, block_size), max_new_tokens=23,
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



def test_a_static_verify_forward_runs_at_the_next_power_of_two_of_what_it_feeds(llama, cheap_width):
    """Adaptive drafts vary in width: each static forward pads only to the next width of the ladder (powers of
    two, then block and 2·block + 1's), not to the widest step, which made compiled steps slower than eager.
    The forward costs are a fixed rule here (`cheap_width`), not timed: the widths must not hang on a machine."""
    from sbd.decoding.engine import bucket

    decode = []
    for p in random_prompts(3, llama.config.vocab_size):  # alone: a forward's width is its one row's
        seen = []
        sbd.generate(llama, None, [p], method="sbd-verify", block_size=8, max_new_tokens=40, static_shapes=True,
                     eos_token_ids=[], draft="adaptive", observer=lambda r: seen.append((r.input_ids.shape[1], r.reals[0])))
        decode += seen[1:]  # after the prefill
    assert any(fed < 8 for _, fed in decode), decode  # forwards narrower than a block: where the ladder matters
    for width, fed in decode:
        assert width == (bucket(fed) if bucket(fed) < 16 else 16 if fed <= 16 else 17), (width, fed)

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


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_decoding_gives_the_same_tokens(monkeypatch):
    """compile=True (torch.compile over the static shapes) on a one-layer model: same tokens as eager,
    and a second call reuses the compiled forwards (no recompilation for a new prompt). On a CPU with sbd's
    C++ decoder layers compile=True is refused (slower than eager): switched off here."""
    from sbd.models import tiny

    monkeypatch.setenv("SBD_NATIVE", "0")
    cfg = tiny.tiny_config("llama", vocab_size=64, hidden=32, layers=1, heads=2, kv_heads=1, context=256)
    model = tiny.random_model(cfg, seed=3, logit_scale=150.0)
    model.config.sbd_mask_token_id = 63
    prompts = random_prompts(2, 60, lengths=(5, 9))
    torch._dynamo.reset()
    for method in ("ntp", "sbd-verify"):
        eager = sbd.generate(model, None, prompts[:1], method=method, **blocks(method, 4), max_new_tokens=12, eos_token_ids=[])
        fast = sbd.generate(model, None, prompts[:1], method=method, **blocks(method, 4), max_new_tokens=12, eos_token_ids=[],
                            compile=True)
        assert fast.token_ids == eager.token_ids and fast.nfe == eager.nfe
    counters = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    again = sbd.generate(model, None, prompts[1:], method="ntp", max_new_tokens=12, eos_token_ids=[], compile=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == counters
    assert again.token_ids == sbd.generate(model, None, prompts[1:], method="ntp", max_new_tokens=12,
                                           eos_token_ids=[]).token_ids


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_decoding_with_a_drafting_adapter_and_rows_that_finish_apart(monkeypatch):
    """compile=True over a drafting adapter (its gate a per-row tensor in every fixed-shape forward) and a
    batch whose rows stop at different times (idle slots fill the batch up to a power of two): the same
    tokens, forwards and accepted drafts as eager (plain SBD's tokens depend on the adapter, so its hooks
    ran inside the compiled graph), a few graphs only, and none more for new prompts."""
    from sbd.drafters import adapter as adapters
    from sbd.models import tiny

    monkeypatch.setenv("SBD_NATIVE", "0")  # else refused on a CPU (below)
    cfg = tiny.tiny_config("llama", vocab_size=64, hidden=32, layers=1, heads=2, kv_heads=1, context=256)
    model = tiny.random_model(cfg, seed=3, logit_scale=150.0)
    model.config.sbd_mask_token_id = 63
    attach_random_adapter(model)
    eos, lengths = [7], set()
    try:
        torch._dynamo.reset()
        start = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        for method, kw in (("sbd", {"gamma": 0.35}), ("sbd-verify", {"draft": "block", "lookup": False})):
            for prompts in (random_prompts(3, 60, lengths=(5, 9, 2)), random_prompts(3, 60, lengths=(4, 1, 7), seed=1)):
                eager = sbd.generate(model, None, prompts, method=method, block_size=4, max_new_tokens=30,
                                     eos_token_ids=eos, **kw)
                fast = sbd.generate(model, None, prompts, method=method, block_size=4, max_new_tokens=30,
                                    eos_token_ids=eos, compile=True, **kw)
                assert fast.token_ids == eager.token_ids and fast.nfe == eager.nfe
                assert fast.accepted == eager.accepted
                lengths.add(tuple(len(t) for t in eager.token_ids))
        assert any(len(set(x)) > 1 for x in lengths)  # some rows did finish apart
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - start
        assert graphs <= 2 * 3 * 2  # two methods, at most three widths and two batch buckets each
    finally:
        adapters.detach(model)


def test_compile_is_refused_where_the_eager_forward_runs_native_layers(monkeypatch):
    """A slow path is not a silent one: on a CPU sbd's eager forward runs its decoder layers from C++ and
    beat the compiled step (SmolLM2: 0.75x eager), so compile=True is refused in one line saying so."""
    from sbd.models import extension
    from sbd.decoding.llama_forward import runs_natively
    from sbd.decoding.spec import SpecError
    from sbd.models import tiny

    cfg = tiny.tiny_config("llama", vocab_size=64, hidden=32, layers=1, heads=2, kv_heads=1, context=256)
    model = tiny.random_model(cfg, seed=3, logit_scale=150.0).to(DEVICE)
    monkeypatch.setattr(extension, "_MODULE", {})  # not known to be unbuildable
    want = DEVICE.type == "cpu"
    assert runs_natively(model) == want
    if want:
        with pytest.raises(SpecError, match="runs slower than sbd's eager forward"):
            sbd.generate(model, None, [[5, 6, 7]], method="ntp", max_new_tokens=4, compile=True)
    monkeypatch.setenv("SBD_NATIVE", "0")
    assert not runs_natively(model)
