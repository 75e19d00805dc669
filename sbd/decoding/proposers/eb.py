"""Drafts revealed by the EB rule (sbd-verify's draft "eb", a `Drafter`): a block of masks after the head,
revealed over forwards of its own by the entropy-bounded rule of plain SBD (docs/method.md §4), becomes
the next draft once nothing in it is masked: better drafts for more forwards.

While a block is being revealed (`active`), the row feeds it (`feed`: no committed token, the whole block
fed as masks and tokens) and hands its logits here; `values` asks for the picked tokens and their
entropies (and the proxy's order), `propose` reveals what the rule allows and returns the draft when the
block is done, else [] (another forward of its own comes first).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...sampler import entropy_and_argmax, error_proxy
from ..forward import Feed
from .base import Seen


def eb_rule(h: Sequence[float], masked: Sequence[bool], gamma: float,
            order: Sequence[float] | None = None) -> list[int]:
    """The EB rule (§4) on host values: the positions to reveal among the `masked` ones, ordered by
    `order` (None: by entropy), bounded by the entropies `h`: the largest prefix U with
    ΣH_U − max H_U ≤ γ, at least one position. Ties go to the lower position. Same result as
    `sbd.sampler.reveal_from_proxy`."""
    idx = [i for i, m in enumerate(masked) if m]
    hh = [max(0.0, float(x)) for x in h]
    key = hh if order is None else [float(x) for x in order]
    idx.sort(key=lambda i: key[i])  # stable: equal keys keep the lower position first
    keep, total, top = [], 0.0, 0.0
    for n, i in enumerate(idx):
        if order is None:  # sorted by entropy: the newest member is the largest, excess = sum before it
            excess = total
        else:
            top = max(top, hh[i])
            excess = 0.0 if n == 0 else total + hh[i] - top
        if excess > gamma:
            break
        keep.append(i)
        total += hh[i]
    return keep


class EBReveal:
    """One row's block under the EB rule: [head, masks…] revealed until nothing is masked."""

    source = "masks"

    def __init__(self, block_size: int, gamma: float, proxy: str, mask_id: int):
        self.k, self.gamma, self.proxy, self.mask_id = block_size, gamma, proxy, int(mask_id)
        self.block: list[int] | None = None  # [head, …] while revealing
        self.masked: list[bool] = []

    @property
    def active(self) -> bool:
        return self.block is not None

    @property
    def width(self) -> int:
        return self.k * (2 if self.proxy == "entropy" else 3)

    def start(self, head: int) -> None:
        """A new block after `head`: all masks."""
        self.block = [head] + [self.mask_id] * (self.k - 1)
        self.masked = [False] + [True] * (self.k - 1)

    def feed(self) -> Feed:
        return Feed(self.block, 0, self.k)

    def values(self, seen: Seen) -> list[torch.Tensor]:
        """Picked tokens, entropies (and the proxy's order) of the block's logits `seen.masks` (the mask
        token never picked)."""
        logits = seen.masks
        logits[:, self.mask_id] = torch.finfo(logits.dtype).min
        h, picked = entropy_and_argmax(logits)
        parts = [picked.double(), h.double()]
        if self.proxy != "entropy":
            parts.append(error_proxy(logits, self.proxy).double())
        return parts

    def propose(self, values: Sequence[float], seen: Seen | None = None) -> list[int]:
        """One EB step; the draft (the block after its head) when nothing is masked any more, else []."""
        k = self.k
        picked, h = [int(v) for v in values[:k]], values[k : 2 * k]
        order = values[2 * k : 3 * k] if self.proxy != "entropy" else None
        for i in eb_rule(h, self.masked, self.gamma, order):
            self.block[i], self.masked[i] = picked[i], False
        if any(self.masked):
            return []
        draft, self.block = self.block[1:], None
        return draft
