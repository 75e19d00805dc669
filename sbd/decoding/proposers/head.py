"""The sampler head's chain (`sbd.drafters.sampler_head`): each place re-ranked among the masks' top candidates
given the token chosen before it. The device builds a table (`values`); the host walks it (`propose`)."""

from __future__ import annotations

import torch

from ...drafters.sampler_head import walk


def values(drafting, masks: torch.Tensor, at: int, first: torch.Tensor, probs: bool) -> torch.Tensor:
    """The head's table for the places whose masks' logits are `masks` (m, V), at the row's logit
    positions at, at + 1, …; first: the token before them; probs: with each pick's probability."""
    return drafting.table(masks, at, first, probs=probs).double()


def propose(table, m: int, probs: bool):
    """The chain of m tokens the table encodes; with probs, (chain, each token's probability)."""
    return walk(table, m, probs=probs)
