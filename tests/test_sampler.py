"""The EB rule of SPEC §4, on hand-made entropies and against a brute-force reference."""

import math

import pytest
import torch

from sbd.sampler import eb_reveal, error_proxy, pick_tokens, reveal_from_proxy


def logits_with_entropies(entropies, vocab=64):
    """Logits whose softmax has (to fp precision) the given entropies, one row per position."""
    rows = []
    for target in entropies:
        lo, hi = 0.0, 60.0  # bisect the scale of a fixed logit vector: entropy decreases with scale
        base = -torch.arange(vocab, dtype=torch.float64)
        for _ in range(200):
            mid = (lo + hi) / 2
            h = torch.special.entr(torch.softmax(base * mid, -1)).sum()
            lo, hi = (mid, hi) if h > target else (lo, mid)
        rows.append(base * hi)
    return torch.stack(rows).float()[None]


def brute_force(h, masked, gamma, order=None):
    """Try every prefix of the masked positions sorted by (proxy, position); keep the largest whose
    entropies sum, minus their largest, to at most γ."""
    order = h if order is None else order
    out = torch.zeros_like(masked)
    for b in range(h.shape[0]):
        cand = sorted((float(order[b, i]), i) for i in range(h.shape[1]) if masked[b, i])
        best = 0
        for s in range(1, len(cand) + 1):
            ents = sorted(max(float(h[b, i]), 0.0) for _, i in cand[:s])
            if sum(ents[:-1]) <= gamma:  # Σ − max, summed without a subtraction
                best = s
        for _, i in cand[:best]:
            out[b, i] = True
    return out


def test_worked_example_reveals_three():
    logits = logits_with_entropies([0.3, 0.02, 1.2, 0.05])
    h = error_proxy(logits)[0]
    assert torch.allclose(h, torch.tensor([0.3, 0.02, 1.2, 0.05]), atol=1e-4)
    reveal = eb_reveal(logits, torch.ones(1, 4, dtype=torch.bool), gamma=0.1)
    assert reveal.tolist() == [[True, True, False, True]]


def test_gamma_zero_reveals_the_single_most_certain_position():
    logits = logits_with_entropies([0.5, 0.2, 0.9, 0.4])
    reveal = eb_reveal(logits, torch.ones(1, 4, dtype=torch.bool), gamma=0.0)
    assert reveal.tolist() == [[False, True, False, False]]


def test_gamma_inf_reveals_every_masked_position():
    logits = torch.randn(3, 5, 50)
    masked = torch.rand(3, 5) < 0.6
    masked[0] = True
    assert torch.equal(eb_reveal(logits, masked, gamma=math.inf), masked)


def test_revealed_positions_are_never_reselected_and_rows_without_masks_are_untouched():
    h = torch.tensor([[0.0, 5.0, 0.0, 0.1], [0.0, 0.0, 0.0, 0.0]])
    masked = torch.tensor([[False, True, False, True], [False, False, False, False]])
    reveal = reveal_from_proxy(h, masked, gamma=0.0)
    assert reveal.tolist() == [[False, False, False, True], [False, False, False, False]]
    assert not (reveal & ~masked).any()


def test_ties_go_to_the_lower_position():
    h = torch.tensor([[0.5, 0.25, 0.25, 0.25]])  # exactly representable: no rounding at the bound
    reveal = reveal_from_proxy(h, torch.ones(1, 4, dtype=torch.bool), gamma=0.0)
    assert reveal.tolist() == [[False, True, False, False]]
    reveal = reveal_from_proxy(h, torch.ones(1, 4, dtype=torch.bool), gamma=0.25)
    assert reveal.tolist() == [[False, True, True, False]]


def test_vectorised_rule_matches_brute_force_on_random_cases():
    g = torch.Generator().manual_seed(0)
    for trial in range(400):
        b, k = 1 + trial % 4, 1 + trial % 17
        h = torch.rand(b, k, generator=g, dtype=torch.float64) * 0.5
        if trial % 3 == 0:  # force ties
            h = (h * 10).round() / 10
        masked = torch.rand(b, k, generator=g) < 0.7
        gamma = [0.0, 0.05, 0.1, 0.35, 0.6, 1.0, math.inf][trial % 7]
        got = reveal_from_proxy(h, masked, gamma)
        assert torch.equal(got, brute_force(h, masked, gamma)), (h, masked, gamma)
        has_mask = masked.any(-1)
        assert torch.equal(got.any(-1), has_mask)  # at least one where any mask is left, none elsewhere


@pytest.mark.parametrize("proxy", ["entropy", "confidence", "margin"])
def test_every_proxy_orders_and_the_entropy_bounds(proxy):
    """eb_reveal on real logits against the brute force: order by the proxy, bound by entropies."""
    g = torch.Generator().manual_seed(1)
    for trial in range(200):
        b, k = 1 + trial % 3, 1 + trial % 16
        logits = torch.randn(b, k, 12, generator=g) * (1 + 4 * torch.rand(b, k, 1, generator=g))
        masked = torch.rand(b, k, generator=g) < 0.7
        gamma = [0.0, 0.1, 0.35, 0.6, 1.0, 3.0, math.inf][trial % 7]
        got = eb_reveal(logits, masked, gamma, proxy=proxy)
        expected = brute_force(error_proxy(logits, "entropy"), masked, gamma, error_proxy(logits, proxy))
        assert torch.equal(got, expected), (trial, proxy)


def test_confidence_order_with_entropy_bound_differs_from_summing_the_proxy():
    """Two positions with confidence proxies 0.02 and 0.3 but entropies 0.5 and 0.9: at γ = 0.35 the
    proxy sum (0.02) would admit both; the entropy bound (0.5) admits only the first."""
    logits = logits_with_entropies([0.5, 0.9])
    order = error_proxy(logits, "confidence")
    assert order[0, 0] < order[0, 1]
    reveal = eb_reveal(logits, torch.ones(1, 2, dtype=torch.bool), gamma=0.35, proxy="confidence")
    assert reveal.tolist() == [[True, False]]


def test_proxies_are_the_documented_quantities():
    logits = torch.randn(2, 3, 20)
    p = torch.softmax(logits, -1)
    assert torch.allclose(error_proxy(logits, "entropy"), -(p * p.log()).sum(-1), atol=1e-5)
    assert torch.allclose(error_proxy(logits, "confidence"), 1 - p.max(-1).values, atol=1e-6)
    top = p.sort(-1, descending=True).values
    assert torch.allclose(error_proxy(logits, "margin"), 1 - (top[..., 0] - top[..., 1]), atol=1e-6)


def test_entropy_uses_the_full_distribution_not_the_sampled_token():
    # Same top-1 probability, different tails: a sampled-token "entropy" could not tell them apart.
    a = torch.log(torch.tensor([0.5, 0.5] + [1e-9] * 8))
    b = torch.log(torch.tensor([0.5] + [0.5 / 9] * 9))
    h = error_proxy(torch.stack([a, b])[None])
    assert h[0, 1] > h[0, 0] + 0.5


def test_bad_gamma_and_proxy_are_refused():
    logits, masked = torch.randn(1, 2, 5), torch.ones(1, 2, dtype=torch.bool)
    for gamma in (-0.1, float("nan")):
        with pytest.raises(ValueError):
            eb_reveal(logits, masked, gamma)
    with pytest.raises(ValueError):
        eb_reveal(logits, masked, 0.1, proxy="perplexity")


def test_temperature_sampling_is_seeded_and_follows_the_distribution():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))[None].expand(20000, 3)
    first = pick_tokens(logits, 1.0, torch.Generator().manual_seed(1))
    again = pick_tokens(logits, 1.0, torch.Generator().manual_seed(1))
    other = pick_tokens(logits, 1.0, torch.Generator().manual_seed(2))
    assert torch.equal(first, again) and not torch.equal(first, other)
    freq = torch.bincount(first, minlength=3).float() / first.numel()
    assert torch.allclose(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.02)
    assert torch.equal(pick_tokens(logits, 0.0), torch.zeros(20000, dtype=torch.long))
