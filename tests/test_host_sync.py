"""The decoding loops read from the device once per forward (the stop check), never more.

On a GPU every read of a tensor value on the host (`.tolist()`, `.item()`, `bool(t)`, `int(t)`,
`.nonzero()`) waits for the device; the loops batch everything a forward needs to know into one read.
Counted here on CPU by wrapping those methods: the count per extra forward must be exactly one.
"""

import pytest
import torch

import sbd

from conftest import blocks, random_prompts

READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero")


@pytest.fixture
def count_reads(monkeypatch):
    counter = {"n": 0}
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, _original=original, **k):
            counter["n"] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    return counter


def _reads_and_forwards(model, count_reads, prompts, **kw):
    """Host reads and model calls of one `generate` (a batch's forwards, not a row's NFE)."""
    calls = []
    before = count_reads["n"]
    sbd.generate(model, None, prompts, eos_token_ids=[], observer=calls.append, **kw)
    return count_reads["n"] - before, len(calls)


@pytest.mark.parametrize("method,kw", [("ntp", {}), ("sbd", {"gamma": 0.0}), ("sbd", {"gamma": 0.35}),
                                       ("sbd", {"gamma": float("inf")}), ("sbd-verify", {})])
@pytest.mark.parametrize("batch", [1, 3])
def test_one_host_read_per_forward(llama, count_reads, method, kw, batch):
    """Two budgets, no EOS: the extra forwards of the longer run cost exactly one read each (the fixed
    reads of a call — prompts, results — cancel)."""
    prompts = random_prompts(batch, llama.config.vocab_size, lengths=(5, 9, 7))
    short_reads, short_nfe = _reads_and_forwards(llama, count_reads, prompts, method=method, **blocks(method, 4),
                                                 max_new_tokens=16, **kw)
    long_reads, long_nfe = _reads_and_forwards(llama, count_reads, prompts, method=method, **blocks(method, 4),
                                               max_new_tokens=48, **kw)
    assert long_nfe > short_nfe
    assert long_reads - short_reads == long_nfe - short_nfe
