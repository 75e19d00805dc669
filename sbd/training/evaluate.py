"""Held-out NTP and MATP losses of a model on fixed batches (same masks for every model compared)."""

from __future__ import annotations

import torch

from .collator import SBDDataCollator
from .loss import sbd_loss


@torch.no_grad()
def evaluate_losses(model, collator: SBDDataCollator, examples, block_size: int = 4, seed: int = 0,
                    batch_size: int = 16) -> dict:
    """{"ntp_loss", "matp_loss"}: pooled means over `examples` with block size `block_size` and masks
    drawn from `seed`, so that two models (e.g. an SBD and an NTP run) are scored on the same targets."""
    was_training = model.training
    model.eval()
    device = model.get_input_embeddings().weight.device
    g = torch.Generator().manual_seed(seed)
    sums = torch.zeros(4, dtype=torch.float64)
    try:
        for start in range(0, len(examples), batch_size):
            clean = collator.pad([examples[i] for i in range(start, min(start + batch_size, len(examples)))])
            eta, u = collator.draw_noise(clean["input_ids"].shape[0], collator.noisy_length(clean), g)
            batch = collator.corrupt({k: v.to(device) for k, v in clean.items()}, block_size, eta, u)
            labels, num_clean = batch.pop("labels"), batch.pop("num_clean")
            parts = sbd_loss(model(**batch).logits, labels, num_clean)
            sums += torch.tensor([parts.ntp_sum, parts.ntp_count, parts.matp_sum, parts.matp_count],
                                 dtype=torch.float64)
    finally:
        model.train(was_training)
    return {"ntp_loss": float(sums[0] / sums[1].clamp_min(1)), "matp_loss": float(sums[2] / sums[3].clamp_min(1))}
