"""The convergence check against a naive reference: one uncached forward per scored token."""

from __future__ import annotations

import pytest
import torch

from sbd.errors import SBDError
from sbd.training.convergence import ENTROPY_BINS, convergence_check
from sbd.masks import inference_mask
from sbd.sampler import error_proxy


def naive_counts(model, ids, start, k, mask_id, eos):
    """Per scored token t: NTP top-1, masked top-1 with the true block tokens before t and masks from t
    on, and masked top-1 with the whole block masked, each from its own full forward without a cache."""
    n = len(ids)
    causal = model(input_ids=torch.tensor([ids], device=model.device)).logits[0]
    final_start = start + (n - 1 - start) // k * k if ids[-1] in eos else n
    counts = [[[0, 0, 0, 0] for _ in range(k)] for _ in range(2)]
    entropies = []
    for t in range(start, n):
        j = (t - start) % k
        b0 = t - j
        prefix = ids[:b0]
        true_block = [ids[p] if p < n else mask_id for p in range(b0, b0 + k)]

        def masked_logits(block):
            x = torch.tensor([prefix + block], device=model.device)
            mask = inference_mask(torch.zeros(1, dtype=torch.long, device=model.device), 0, len(prefix), k)
            pos = torch.arange(len(prefix) + k, device=model.device)[None]
            out = model(input_ids=x, position_ids=pos, attention_mask=mask).logits
            row = out[0, len(prefix) + j].float()
            row[mask_id] = torch.finfo(row.dtype).min
            return row

        left = masked_logits([tok if i < j else mask_id for i, tok in enumerate(true_block)])
        full = masked_logits([mask_id] * k)
        cell = counts[int(t >= final_start)][j]
        cell[0] += 1
        cell[1] += int(causal[t - 1].argmax() == ids[t])
        cell[2] += int(left.argmax() == ids[t])
        cell[3] += int(full.argmax() == ids[t])
        entropies.append((float(error_proxy(left[None], "entropy")[0]), int(left.argmax() == ids[t])))
    return counts, entropies


@torch.no_grad()
def test_matches_naive_reference(llama):
    g = torch.Generator().manual_seed(0)
    mask_id, eos = llama.config.sbd_mask_token_id, llama.generation_config.eos_token_id
    examples = []
    for n, p in [(23, 5), (9, 0), (17, 8)]:
        ids = torch.randint(3, 300, (n,), generator=g, device="cpu").tolist()
        if p:
            ids[-1] = eos  # the completions end with EOS: their last block is the final block
        examples.append({"input_ids": ids, "prompt_length": p})
    for k in (4, 16):
        report = convergence_check(llama, examples, block_size=k)
        expected = [[[0, 0, 0, 0] for _ in range(k)] for _ in range(2)]
        bins = [[0, 0] for _ in range(len(ENTROPY_BINS) - 1)]
        for ex in examples:
            counts, entropies = naive_counts(llama, ex["input_ids"], max(ex["prompt_length"], 1), k, mask_id, {eos})
            for r in range(2):
                for j in range(k):
                    expected[r][j] = [a + b for a, b in zip(expected[r][j], counts[r][j])]
            for h, ok in entropies:
                i = next(i for i in range(len(bins)) if h < ENTROPY_BINS[i + 1])
                bins[i][0] += 1
                bins[i][1] += ok
        assert report.counts == expected
        assert report.bins == bins
        assert report.sequences == 3
        assert sum(c[0] for r in expected for c in r) == 18 + 8 + 9
        assert expected[1][0][0] > 0, "no final-block token: the region split is not tested"
        h = report.headline()
        assert h["gap"] == pytest.approx(h["masked_acc"] - h["ntp_acc"])


def test_refuses_models_without_a_mask_token(llama):
    llama.config.sbd_mask_token_id, saved = None, llama.config.sbd_mask_token_id
    try:
        with pytest.raises(SBDError, match="mask token"):
            convergence_check(llama, [{"input_ids": [5, 6, 7], "prompt_length": 1}])
    finally:
        llama.config.sbd_mask_token_id = saved
