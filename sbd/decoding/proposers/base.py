"""The one interface of sbd-verify's drafters, for sbd's rows and the vLLM proposer alike.

A verifying forward computes, besides the next-token logits that check the current draft, the masks'
logits for the places after it. A drafter makes its next draft from that forward in two calls, around the
one host read an engine makes per step:

- `values(seen)`, on the device: what it needs read (the masks' argmax, the sampler head's table, the top
  candidates at a tree's depths; nothing for prompt lookup, which reads the committed tokens). `width` is
  how many values that was;
- `propose(values, seen)`, on the host: from those values, laid out as `values` made them, and the tokens
  committed so far, its draft (a chain of token ids; a tree's branches for `TreeBranches`).

`source` names the record whose acceptance prices its drafts ("masks" or "lookup", `DraftPolicy`). How
long a draft is and which drafter's draft is put up is the policy's, never the drafter's. A new drafter
is a new file with these calls; neither `VerifyRow` nor the vLLM proposer changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch


@dataclass
class Seen:
    """What a drafter may read of one verifying forward. On the device (`values`): the masks' logits at the
    next draft's places, where they start among the row's logits (`at`, which the sampler head's hidden
    states follow), the token before them (`first`, 0-d) and the sampler head (`drafting`) when it drafts.
    On the host (`propose`): the tokens committed so far after the prompt (`out`) and the longest draft
    wanted (`longest`)."""

    masks: torch.Tensor | None = None
    at: int = 0
    first: torch.Tensor | None = None
    drafting: object = None
    out: Sequence[int] = field(default_factory=list)
    longest: int = 0


class Drafter(Protocol):
    """A source of drafts (module docstring)."""

    source: str
    width: int

    def values(self, seen: Seen) -> list[torch.Tensor]:
        """The device values this drafter needs read from a verifying forward ([] for none)."""

    def propose(self, values: Sequence[float], seen: Seen) -> list:
        """The draft, from the values `values` asked for (they lead `values`)."""
