"""The numeric rules of draft lengths: pure functions of an acceptance rate and a cost of width
(width → relative forward time, `sbd.decoding.width_cost` or the vLLM proposer's measured one). The
policy that keeps the acceptance record and calls them is `sbd.decoding.draft_policy`."""

from __future__ import annotations

from typing import Sequence


def expected_tokens(alpha: float, d: int) -> float:
    """Tokens a verifying forward yields on average with a draft of d tokens, each standing with
    probability alpha once the one before it stood: the kept draft prefix plus the head's own token."""
    return 1 + (d * alpha if alpha >= 1 else alpha * (1 - alpha ** d) / (1 - alpha))


def best_draft_length(alpha: float, cost, longest: int, tree: Sequence[int] = (), restart: bool = True) -> int:
    """The draft length d (0..longest) that maximises expected tokens per unit of forward time.

    A verifying forward with a draft of d ≥ 1 tokens feeds 1 + d + (d + 1) tokens (head, draft, and the
    masks that draft the next d) and costs `cost(2d + 2)` one-token forwards; if each draft token stands
    with probability alpha once the one before it stood, it yields 1 + alpha·(1 − alpha^d)/(1 − alpha)
    tokens on average. When a draft token is refused (1 − alpha^d), the masks beside it drafted for the
    wrong places: the next forward has no draft and feeds its d + 1 masks alone, one token for
    `cost(d + 2)`, before drafts resume. That restart is counted with the draft that causes it (without
    it, on int4 SmolLM2 chat prompts every refused draft was followed by such a forward, and sbd-verify ran
    at 0.84x NTP: docs/performance.md §9, "Refused drafts cost a forward more"). d = 0 is a plain
    next-token step (1 token for `cost(1)`), chosen when no draft pays for its width. tree: widths per
    depth of tree drafts, whose branches widen the forward by w − 1 tokens at each depth up to d (alpha is
    then the tree's rate per depth). restart False: the restart is not charged (sbd's engine decoding
    several rows in one forward: a row's restart rides in a forward as wide as the other rows make it; charged
    there, the demo model's batches of 8 took 1.2–1.6x the forwards)."""
    best, value = 0, 1.0 / cost(1)
    for d in range(1, max(0, longest) + 1):
        r = 1.0 - alpha ** d if restart and alpha < 1 else 0.0
        v = (expected_tokens(alpha, d) + r) / (cost(2 * d + 2 + sum(w - 1 for w in tree[:d])) + r * cost(d + 2))
        if v > value + 1e-12:
            best, value = d, v
    return best


def best_lookup_length(alpha: float, cost, longest: int) -> int:
    """How many of a prompt-lookup continuation's `longest` tokens to put up (1..longest): the length that
    maximises expected tokens per unit of forward time. A forward verifying a lookup draft of d tokens
    feeds 1 + d tokens (head and draft, no masks) and costs `cost(d + 1)`; each draft token stands with
    probability alpha once the one before it stood (lookup's own record, not the masks'). At least one
    token, so that lookup's record keeps growing."""
    best, value = 1, -1.0
    for d in range(1, max(1, longest) + 1):
        v = expected_tokens(alpha, d) / cost(d + 1)
        if v > value + 1e-12:
            best, value = d, v
    return best


def confident_length(probs: Sequence[float], cost, masks: int, refusal: float) -> int:
    """How much of the masks' next draft to put up (0..len(probs)), from how sure the drafter is of each
    token: probs[i] is its drafting probability (the masks' softmax, or the sampler head's over the masks'
    top candidates), read as the chance that token i stands once the ones before it stood (calibrated
    closely enough on both shipped models: docs/performance.md, "Drafts cut by the drafter's confidence").

    A draft of t tokens yields 1 + Σ_{i≤t} P_i tokens on average (P_i = probs[0]·…·probs[i−1]); if one
    of them is refused (1 − P_t), the `masks` fed behind it drafted for the wrong places and the next
    forward has no draft, which costs about `refusal` more tokens. The forward feeds 1 + t + masks tokens
    and costs `cost(1 + t + masks)`. The t with the most tokens per unit of time wins. So a draft stops
    before the place where the drafter is unsure: the next-token head fills that place for free, and the
    masks behind the shorter draft stay in the right context."""
    best, keep, stands, expected = 1.0 / cost(1 + masks), 0, 1.0, 0.0
    for t, p in enumerate(probs, 1):
        stands *= p
        expected += stands
        value = (1 + expected - refusal * (1 - stands)) / cost(1 + t + masks)
        if value > best + 1e-12:
            best, keep = value, t
    return keep
