"""The SBD loss (docs/method.md §2): one cross-entropy mean pooled over the valid targets of both halves.

NTP and MATP are weighted 1:1 by pooling, with no 1/η factor. The sums and counts of each half are
returned too, so that the two losses can be logged separately and averaged over many batches exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .collator import IGNORE


@dataclass
class LossParts:
    loss: torch.Tensor          # pooled mean over `denominator` targets (differentiable)
    ntp_sum: torch.Tensor       # detached sums and counts of each half
    ntp_count: torch.Tensor
    matp_sum: torch.Tensor
    matp_count: torch.Tensor


def sbd_loss(logits: torch.Tensor, labels: torch.Tensor, num_clean: int | None = None,
             denominator=None) -> LossParts:
    """Cross-entropy of `logits` (B,T,V) against `labels` (B,T), already aligned (no shift here).

    `logits` may also be (N,V): the rows of the N labelled positions only (`labels != -100`, row-major
    order), as `sbd.training.attention.training_logits` returns them.

    num_clean: length of the clean half (default T // 2; T for an NTP batch). denominator: the number of
    targets the mean is taken over (default: this batch's; a trainer passes the whole step's, so that
    gradient accumulation and data parallelism give the pooled mean of the full step).
    """
    t = labels.shape[1]
    num_clean = t // 2 if num_clean is None else num_clean
    valid = labels != IGNORE
    if logits.dim() == 2:                       # already the labelled rows
        if logits.shape[0] != int(valid.sum()):
            raise ValueError(f"logits of shape {tuple(logits.shape)} for {int(valid.sum())} labelled positions")
        picked = logits.float()
    else:
        picked = logits[valid].float()          # only target positions are upcast
    ce = F.cross_entropy(picked, labels[valid], reduction="none")
    total = ce.sum()
    in_clean = valid.nonzero()[:, 1] < num_clean
    ntp_sum = ce[in_clean].sum().detach()
    matp_sum = (total.detach() - ntp_sum)
    ntp_count = in_clean.sum()
    matp_count = valid.sum() - ntp_count
    if denominator is None:
        denominator = valid.sum()
    loss = total / torch.as_tensor(denominator, device=total.device).clamp_min(1)
    return LossParts(loss, ntp_sum, ntp_count, matp_sum, matp_count)
