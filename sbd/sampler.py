"""The EB-Sampler rule and the choice of the revealed tokens (docs/method.md §4).

`eb_reveal` sorts the still-masked positions of each row by an error proxy (lower = more certain) and
reveals the largest prefix U of that order with  Σ_U H − max_U H ≤ γ,  where H is always the entropy of
each position's distribution: the proxy orders, the entropy bounds.
"""

from __future__ import annotations

import math

import torch

PROXIES = ("entropy", "confidence", "margin")


def error_proxy(logits: torch.Tensor, proxy: str = "entropy") -> torch.Tensor:
    """Per-position uncertainty of the full predictive distribution, fp32, (…, V) → (…).

    entropy: Shannon entropy in nats. confidence: 1 − p(top-1). margin: 1 − (p(top-1) − p(top-2)).
    NaN or ±inf logits give a non-finite proxy, which the decoding loop turns into an error.
    """
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    if proxy == "entropy":
        # p · log_softmax: log(p) and exp(log p) both hit denormals on peaked rows, 5-10x slower on CPU
        return -(probs * torch.log_softmax(logits, dim=-1)).sum(-1)
    if proxy == "confidence":
        return 1.0 - probs.amax(-1)
    if proxy == "margin":
        top = probs.topk(2, dim=-1).values
        return 1.0 - (top[..., 0] - top[..., 1])
    raise ValueError(f"unknown proxy {proxy!r}; choose one of {', '.join(PROXIES)}")


def entropy_and_argmax(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy (nats, fp32) and argmax of every position, (…, V) → (…), (…): what a greedy SBD step needs,
    without the log-softmax pass of `error_proxy` (the slowest of its passes on CPU).

    With t the argmax and p = softmax(l):  H = Σ_j p_j (l_t − l_j) − log p_t,  a sum of non-negative
    terms, so a near-certain position keeps a tiny positive entropy instead of cancelling to 0.
    Agrees with `error_proxy(logits, "entropy")` to ~1e-5.
    """
    logits = logits.float()
    top = logits.argmax(-1)
    probs = torch.softmax(logits, dim=-1)
    at_top = top[..., None]
    gap = logits.gather(-1, at_top) - logits  # ≥ 0 everywhere
    h = torch.linalg.vecdot(probs, gap) - probs.gather(-1, at_top).squeeze(-1).log()
    return h, top


def reveal_from_proxy(h: torch.Tensor, masked: torch.Tensor, gamma: float,
                      order: torch.Tensor | None = None) -> torch.Tensor:
    """The EB rule on precomputed entropies `h` (B, k) for the `masked` (B, k) positions.

    order: the error proxy (B, k) that sets the order (None: the entropies themselves). Ties are broken
    by lower position first (stable sort). Rows with no mask reveal nothing; rows with any mask reveal
    at least one position.
    """
    h = h.double().clamp_min(0.0)
    if order is None:  # sorted by entropy, the largest member is the last: Σ − max = exclusive prefix sum
        # (few small ops on purpose: in a decoding loop each costs more than its arithmetic)
        h_sorted, idx = torch.sort(torch.where(masked, h, math.inf), dim=-1, stable=True)  # unmasked last
        excess = torch.nn.functional.pad(h_sorted[..., :-1].cumsum(-1), (1, 0))  # exact (no subtraction)
        keep = (excess <= gamma) & (h_sorted < math.inf)
    else:
        key = order.double().masked_fill(~masked, math.inf)
        key_sorted, idx = torch.sort(key, dim=-1, stable=True)
        h_sorted = h.gather(-1, idx).masked_fill(~torch.isfinite(key_sorted), 0.0)
        excess = h_sorted.cumsum(-1) - h_sorted.cummax(-1).values  # non-decreasing along the order
        excess[..., 0] = 0.0
        keep = torch.isfinite(key_sorted) & (excess <= gamma)
    return torch.zeros_like(masked).scatter(-1, idx, keep)


def eb_reveal(
    logits: torch.Tensor, masked: torch.Tensor, gamma: float, proxy: str = "entropy"
) -> torch.Tensor:
    """Positions to reveal this step: `logits` (B, k, V), `masked` (B, k) bool → (B, k) bool.

    The positions are ordered by `proxy` and the revealed prefix is bounded by their entropies."""
    if logits.dim() != 3 or masked.shape != logits.shape[:2]:
        raise ValueError("eb_reveal expects logits (B, k, V) and masked (B, k)")
    if math.isnan(gamma) or gamma < 0:
        raise ValueError(f"gamma must be a number >= 0, got {gamma}")
    order = None if proxy == "entropy" else error_proxy(logits, proxy)
    return reveal_from_proxy(error_proxy(logits, "entropy"), masked, gamma, order)


def pick_tokens(
    logits: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Argmax at temperature 0, otherwise a seeded sample from softmax(logits / temperature)."""
    if temperature <= 0:
        return logits.argmax(-1)
    noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    noise.exponential_(generator=generator)
    # Gumbel-max in its exponential form: argmax p / E with E ~ Exp(1) samples from p.
    return (torch.softmax(logits.float() / temperature, dim=-1) / noise).argmax(-1)
