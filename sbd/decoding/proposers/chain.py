"""The masks' chain: the next draft read from the masks a verifying forward fed behind its draft (their
argmax, each token with its drafting probability when the chain is to be cut by confidence), and what is
left of a refused draft for the forward after it. The sampler head's re-ranking of the same masks is its
own drafter (`head.HeadChain`)."""

from __future__ import annotations

from typing import Sequence

import torch

from .base import Seen


def masks_top(logits: torch.Tensor, probs: bool):
    """The masks' top-1 at every place, (tokens, their softmax probabilities or None)."""
    if not probs:
        return logits.argmax(-1), None
    top = logits.float().softmax(-1).max(-1)
    return top.indices, top.values


class MaskChain:
    """One row's or request's chain of the masks' argmax (a `Drafter`): `values` on the device, `propose` on
    the host. Between them it remembers how the values are laid out (m tokens, with probabilities or not).
    cut: send each token's drafting probability too, for a chain cut where the drafter is unsure
    (`DraftPolicy.confident`); they are in `probs` after `propose`."""

    source = "masks"

    def __init__(self):
        self.m = 0  # tokens in the last chain asked for
        self.cut = False  # send each token's drafting probability with the next `values`
        self.sends_probs = False  # the last `values` sent them
        self.probs: list[float] | None = None  # those probabilities, read with the chain

    @property
    def width(self) -> int:
        """Values the chain takes among a row's values (one per token, two with probs)."""
        return self.m * (2 if self.sends_probs else 1)

    def values(self, seen: Seen) -> list[torch.Tensor]:
        """The chain from `seen.masks` (the masks' logits for its places): their argmax."""
        self.m = seen.masks.shape[0]
        self.sends_probs = self.cut and self.m > 0
        tokens, p = masks_top(seen.masks, self.sends_probs)
        return [tokens.double()] if p is None else [tokens.double(), p.double()]

    def propose(self, values: Sequence[float], seen: Seen | None = None) -> list[int]:
        """The chain from the values `values` produced (they lead `values`); its tokens' probabilities,
        when they were sent, go to `probs`."""
        m, self.probs = self.m, None
        if self.sends_probs:
            self.probs = [float(v) for v in values[m : 2 * m]]
        return [int(v) for v in values[:m]]


def leftover_draft(draft: Sequence[int], kept: int, next_token: int) -> list[int]:
    """A draft for the forward after a refused one, from the refused draft itself (greedy).

    The masks draft each block position from the committed prefix, not from the draft tokens before it,
    so the draft tokens after a refused one are guesses for the same places as before: with `kept`
    draft tokens kept and the model's `next_token` in place of draft[kept], the next places are those of
    draft[kept + 1:]. If the model's token is the one drafted a place later (the draft had one token too
    many), the rest from there on. Verification decides, so this only changes what is proposed."""
    rest = list(draft[kept + 1 :])
    if rest and rest[0] == next_token:
        return rest[1:]
    return rest
