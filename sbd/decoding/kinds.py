"""Which row decodes a prompt: the one place that knows every kind of row (`sbd.decoding.rows`, the tree
rows of `sbd.decoding.tree_rows`, the anchored rows of `sbd.decoding.anchored`)."""

from __future__ import annotations

from typing import Sequence

from .anchored import AnchoredRow
from .row import Row
from .rows import NTPRow, SBDRow, VerifyRow
from .tree_rows import TreeRow


def make_row(spec, prompt: list[int], *, mask_id: int | None, eos: Sequence[int] = (), tokenizer=None,
             seed: int | None = None, device=None, cost=None) -> Row:
    """The row that decodes `prompt` as `spec` says (a `sbd.decoding.spec.DecodeSpec`, checked where it was
    resolved): NTP, SBD (anchored or by the EB rule) or sbd-verify. cost: for draft "adaptive", width →
    relative forward time (`sbd.decoding.width_cost`). eos, tokenizer (stop strings), seed (sampling),
    device: what the spec cannot know."""
    if spec.method == "sbd":
        kind = AnchoredRow if spec.anchor else SBDRow
    elif spec.method == "ntp":
        kind = NTPRow
    else:
        kind = TreeRow if spec.tree is not None else VerifyRow
    return kind(spec, prompt, mask_id=mask_id, eos=eos, tokenizer=tokenizer, seed=seed, device=device, cost=cost)
