"""Plain SBD anchored on the model's own next token: the paper's decoding, made to hold on a drafter that
was trained with every block position masked (docs/method.md, "Anchored plain SBD").

Each forward feeds [the tokens revealed by the last forward, committed causally | k masks]. It returns
the next-token head's logits at the last committed token and the masks' logits at the k positions after
it. The forward reveals:
1. the next token from the next-token head (the model's own choice, as NTP would make it);
2. then the masks' tokens after it, left to right, while their uncertainty sums to at most γ:
   - with a sampler head (greedy), the head's chain after the next token (each pick conditioned on the
     token before it, the first on the head's own), bounded by the picks' surprisal −log p (p: the
     head's probability of its pick, calibrated on SmolLM2: a pick of 0.9 stood 91% of the time);
   - without one, the masks' argmax, bounded by their entropies as the EB rule bounds them, and only
     when the first mask agrees with the next token (else the masks drafted after another token).

Nothing is verified, so tokens a mask reveals may differ from NTP's (this is plain SBD, lossy by design),
but the block fed is always all masks, the state a drafter for sbd-verify was trained on, and every
revealed token is committed at once, so the next forward's first token is again the model's own.
γ = 0 is NTP decoding (one token per forward); γ = ∞ takes the whole block whenever the first mask agrees.
"""

from __future__ import annotations

import math

import torch

from ..sampler import entropy_and_argmax, pick_tokens
from .proposers.head import walk
from .forward import Feed
from .row import Row


class AnchoredRow(Row):
    """One sequence decoded with anchored plain SBD (module docstring): `gamma` bounds the summed
    uncertainty of the masks' tokens revealed after the next-token head's; blocks of `block_size` masks."""

    def __init__(self, spec, prompt, *, mask_id: int, cost=None, **kw):
        super().__init__(spec, prompt, **kw)
        self.block_size, self.mask_id, self.gamma = spec.block_size, int(mask_id), float(spec.gamma)
        self.needs_extra = self.block_size
        self.in_prefill = len(self.prompt) > 1
        self.pending = [self.prompt[-1]]  # revealed, committed by the next forward
        self.k = 0
        self._head_chain = 0  # values of the sampler head's table in the last `ask` (0: the masks' own)

    @property
    def drafts_with_head(self) -> bool:
        """Greedy rows take the masks' chain from a sampler head when the model has one."""
        return self.temperature <= 0

    def feed(self) -> Feed:
        if self.in_prefill:
            return Feed(self.prompt[:-1], len(self.prompt) - 1, 0)
        self.k = min(self.block_size, self.max_new - len(self.out))
        return Feed(self.pending + [self.mask_id] * self.k, len(self.pending), 1 + self.k)

    def ask(self, logits: torch.Tensor, drafting=None) -> torch.Tensor:
        logits[1:, self.mask_id] = torch.finfo(logits.dtype).min  # the masks never reveal the mask token
        head = pick_tokens(logits[:1], self.temperature, self.gen)  # (the next-token head is left as it is)
        self._head_chain = 0
        if drafting is not None and self.k > 1:  # the head's chain after the next token, with its probabilities
            table = drafting.table(logits[2:], 2, head[0], probs=True)
            self._head_chain = table.numel()
            return torch.cat([head.double(), table.double()])
        if self.temperature > 0:
            h, _ = entropy_and_argmax(logits[1:])
            picked = pick_tokens(logits[1:], self.temperature, self.gen)
        else:
            h, picked = entropy_and_argmax(logits[1:])
        return torch.cat([head.double(), picked.double(), h.double()])

    def answer(self, values: list[float]) -> int:
        if self.in_prefill:
            self.in_prefill = False
            return 0
        k = self.k
        head, tokens = int(values[0]), [int(values[0])]
        if self.gamma <= 0:  # NTP decoding (a pick of probability 1.0 would otherwise pass a bound of 0)
            return self._commit(tokens)
        if self._head_chain:  # the head's chain, each pick costing its surprisal
            chain, probs = walk(values[1 : 1 + self._head_chain], k - 1, probs=True)
            costs = [-math.log(max(p, 1e-30)) for p in probs]
        elif int(values[1]) == head:  # the masks drafted after the same first token: their entropies
            chain, costs = [int(v) for v in values[2 : 1 + k]], [max(0.0, h) for h in values[2 + k : 1 + 2 * k]]
        else:
            chain, costs = [], []
        total = 0.0
        for token, cost in zip(chain, costs):
            total += cost
            if total > self.gamma:
                break
            tokens.append(token)
        return self._commit(tokens)

    def _commit(self, tokens: list[int]) -> int:
        """Take this forward's tokens; the next forward commits them to the cache."""
        self.nfe += 1
        start = self._take(tokens)
        end = self._end(start, tokens)
        if end is not None:
            self._finish(end)
        self.pending = tokens
        return 0
