"""The sampler head's training loss: its options checked, its teacher-forced logits on the labelled noisy
positions (`head_batch`), and the sums the trainer logs (`head_terms`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..drafters import sampler_head as heads
from ..drafters.adapter import adapter_of
from ..errors import SBDError
from .collator import IGNORE

HEAD_MODES = (None, "joint", "only")  # the sampler head: not trained, trained with the adapter, trained alone


def check_head_options(model, mode, head_mode, weight) -> None:
    """One-line SBDError for a sampler head setting that cannot work; "only" freezes the adapter."""
    if head_mode not in HEAD_MODES:
        raise SBDError(f"sampler_head must be None, 'joint' or 'only', got {head_mode!r}")
    if head_mode is None:
        return
    if mode != "adapter":
        raise SBDError("a sampler head trains with a drafting adapter (mode='adapter')")
    head = heads.head_of(model)
    if head is None:
        raise SBDError("sampler_head needs a head on the model: attach one first (sbd.drafters.sampler_head.attach)")
    if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
        raise SBDError(f"the sampler head's loss weight must be a positive number, got {weight!r}")
    if head_mode == "only":  # (kl_weight and grad_layer with it: `sbd.training.options`)
        adapter_of(model).requires_grad_(False)
    head.requires_grad_(True)


@dataclass
class HeadTerms:
    loss: torch.Tensor      # Σ (weighted) cross-entropy of the head's logits, differentiable
    ce_sum: torch.Tensor    # detached: Σ plain cross-entropy of the head
    base_sum: torch.Tensor  # detached: Σ cross-entropy of the masks' own logits on the same targets
    count: torch.Tensor


def head_batch(model, out, labels, num_clean, previous):
    """The sampler head in teacher forcing: (logits, targets, use). `use` (N,) marks the labelled noisy
    positions (row-major, as `out.logits`) that have a previous place in their block; at those, logits
    = lm_head(h + MLP([h; E(true previous token)] (+ carried state))) and targets their labels. Each block
    runs as one chain from its offset 1 (a state head carries its activation along it, as in decoding); a
    place without a label (a revealed token, padding) feeds the chain a zero hidden state."""
    n = int(num_clean)
    keep = labels[:, n:] != IGNORE
    previous = previous.to(keep.device)
    b, m = previous.shape
    blocks = int((previous[0] < 0).sum())  # every block starts with −1, and nothing else is negative
    k = m // max(blocks, 1)
    if blocks < 1 or k * blocks != m:
        raise SBDError(f"previous tokens of {m} noisy positions do not split into equal blocks")
    grid = out.hidden.new_zeros(b, m, out.hidden.shape[-1])
    grid[keep] = out.hidden                                             # unlabelled places: zeros
    rows = grid.view(b * blocks, k, -1)
    prev = previous.clamp_min(0).view(b * blocks, k)[:, 1:]
    chain = heads.chain_hidden(model, heads.head_of(model), rows[:, 1:], prev)
    corrected = torch.cat([rows[:, :1], chain], 1).view(b, m, -1)
    use = previous[keep] >= 0
    logits = model.get_output_embeddings()(corrected[keep][use])
    return logits, labels[:, n:][keep][use], use


def head_terms(model, out, labels, num_clean, previous, weights) -> HeadTerms:
    """The sampler head's loss sums (`head_batch`), weighted like the masked loss when weights are given."""
    logits, target, use = head_batch(model, out, labels, num_clean, previous)
    ce = torch.nn.functional.cross_entropy(logits.float(), target, reduction="none")
    total = (ce * weights.to(ce)[use]).sum() if weights is not None else ce.sum()
    with torch.no_grad():
        base = torch.nn.functional.cross_entropy(out.logits[use].float(), target, reduction="sum")
    return HeadTerms(total, ce.detach().sum(), base, use.sum())
