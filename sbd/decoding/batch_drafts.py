"""Which drafts of a batch to run in one step: a pure rule over the drafts' records and the step's cost.

In a batch, every request's extra width delays all of them, so the drafts are decided together (the vLLM
proposer does; sbd's engine prices each row's own width with the batch's `StepCost`). A request's draft is
priced as sbd's rules price it (`draft_lengths`): a mask draft of k masks at its steady state (k − 1 chain
tokens standing at the masks' record, 2k wide), a lookup draft of d tokens at lookup's record (1 + d wide).
Drafts are dropped least valuable (extra tokens per extra width) first; the prefix with the most expected
tokens per unit of step time wins, and none (a plain step) when nothing pays.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .draft_lengths import expected_tokens


def draft_gain(policy, draft: Sequence[int], mask_id: int) -> tuple[float, int, bool]:
    """(extra expected tokens, extra width, whether it has masks) of one request's draft over a plain step."""
    if draft[-1] == mask_id:
        k = len(draft) - list(draft).index(mask_id)
        tokens, width = expected_tokens(policy.alpha("masks"), k - 1), 2 * k
    else:
        tokens, width = expected_tokens(policy.alpha("lookup"), len(draft)), 1 + len(draft)
    return tokens - 1.0, max(1, width - 1), draft[-1] == mask_id


def drafts_to_drop(drafts: Sequence[Sequence[int]], policies: Sequence, mask_id: int, batch: int,
                   ratio: Callable[[int, bool], float]) -> list[int]:
    """Indices of the drafts not worth their width this step. policies[i]: request i's `DraftPolicy` (read
    where drafts[i] is not empty); batch: requests in the step (a plain step is `batch` wide); ratio(total
    width, with masks): the step's time relative to a plain step's."""
    gains = sorted(((*draft_gain(policies[i], d, mask_id), i) for i, d in enumerate(drafts) if d),
                   key=lambda g: g[0] / g[1], reverse=True)
    best, best_n = batch / ratio(batch, False), 0
    tokens, width, masks = float(batch), batch, False
    for n, (t, w, m, _) in enumerate(gains, 1):
        tokens, width, masks = tokens + t, width + w, masks or m
        v = tokens / ratio(width, masks)
        if v > best + 1e-12:
            best, best_n = v, n
    return [i for *_, i in gains[best_n:]]
