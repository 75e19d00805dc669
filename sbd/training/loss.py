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


def position_weights(offsets: torch.Tensor, decay: float) -> torch.Tensor:
    """Loss weight of a masked target at `offsets` (its place in its block, 0-based): decay^(offset − 1),
    and 1 at offsets 0 and 1. In sbd-verify the block's first position is the next token (NTP's, not the
    draft's) and a draft token only counts if every one before it stood, so the first draft positions
    decide acceptance; decay < 1 weights the far ones down (as Medusa and EAGLE do for far heads)."""
    return float(decay) ** (offsets - 1).clamp_min(0).to(torch.float32)


def sbd_loss(logits: torch.Tensor, labels: torch.Tensor, num_clean: int | None = None,
             denominator=None, weights: torch.Tensor | None = None, targets: torch.Tensor | None = None,
             target_clean: torch.Tensor | None = None) -> LossParts:
    """Cross-entropy of `logits` (B,T,V) against `labels` (B,T), already aligned (no shift here).

    `logits` may also be (N,V): the rows of the N labelled positions only (`labels != -100`, row-major
    order), as `sbd.training.attention.training_logits` returns them.

    num_clean: length of the clean half (default T // 2; T for an NTP batch). denominator: the number of
    targets the mean is taken over (default: this batch's; a trainer passes the whole step's, so that
    gradient accumulation and data parallelism give the pooled mean of the full step). weights: (N,) a
    weight per labelled position (row-major) for the differentiable loss, whose mean is then taken over
    the weights' total (`denominator` should then be the step's total weight); the logged sums stay
    plain cross-entropy.

    targets, target_clean: `labels[labels != -100]` (N,) and whether each lies in the clean half (N,)
    bool, computed on the host before the batch went to the device (`loss_targets`): with (N,V) logits
    the loss then reads nothing back from the device (no boolean indexing, no count).
    """
    t = labels.shape[1]
    num_clean = t // 2 if num_clean is None else num_clean
    if targets is not None and logits.dim() == 2:   # the labelled rows, their targets known: no host read
        if logits.shape[0] != targets.shape[0]:
            raise ValueError(f"logits of shape {tuple(logits.shape)} for {targets.shape[0]} labelled positions")
        ce = F.cross_entropy(logits.float(), targets, reduction="none")
        total = ce.sum()
        in_clean = target_clean.to(ce.device)
        ntp_sum = torch.where(in_clean, ce.detach(), 0.0).sum()
        matp_sum = (total.detach() - ntp_sum)
        ntp_count = in_clean.sum()
        matp_count = (~in_clean).sum()
        valid = None
    else:
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
    if weights is not None:
        weights = weights.to(ce.device, ce.dtype)
        if weights.shape != ce.shape:
            raise ValueError(f"{tuple(weights.shape)} weights for {ce.shape[0]} labelled positions")
        total_w = (ce * weights).sum()
        if denominator is None:
            denominator = weights.sum()
        loss = total_w / torch.as_tensor(denominator, device=total.device).clamp_min(1e-8)
        return LossParts(loss, ntp_sum, ntp_count, matp_sum, matp_count)
    if denominator is None:
        denominator = valid.sum() if valid is not None else ce.shape[0]
    loss = total / torch.as_tensor(denominator, device=total.device).clamp_min(1)
    return LossParts(loss, ntp_sum, ntp_count, matp_sum, matp_count)


def loss_targets(labels: torch.Tensor, num_clean: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets (N,), target_clean (N,) bool) of `labels` (B,T) for `sbd_loss`, in row-major order of the
    labelled positions; computed where the labels are (the host, before the batch moves)."""
    valid = labels != IGNORE
    return labels[valid], valid.nonzero()[:, 1] < num_clean
