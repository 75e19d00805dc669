"""A tree draft's branches (`TreeBranches`, a `Drafter`): the masks' top candidates at the tree's declared
depths, asked on the device (`values`), read on the host and grown into paths by their summed
log-probabilities (`propose`, `sbd.decoding.trees.beam_paths`). The tree's shape, mask, walk and compaction
are `sbd.decoding.trees`; the row that feeds and verifies trees is `sbd.decoding.tree_rows`."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .. import trees
from .base import Seen


def candidates(masks: torch.Tensor, depth: int, width: int) -> list[torch.Tensor]:
    """The masks' top `width` candidates and their log-probabilities at the first `depth` places."""
    top = torch.log_softmax(masks[:depth].float(), dim=-1).topk(width, dim=-1)
    return [top.indices.double().flatten(), top.values.double().flatten()]


def branches(shape: Sequence[int], values, depth: int, width: int, mask_id: int,
             extra: Sequence[Sequence[int]] = ()) -> list[list[int]]:
    """The branches of a tree of widths `shape` from the candidates `values` lead with (as `candidates`
    made them), plus `extra` chains (the masks' own beside a lookup draft). The mask token is no
    candidate (a tiny vocabulary can rank it)."""
    cand = [[int(v) for v in values[d * width : (d + 1) * width]] for d in range(depth)]
    at = depth * width
    cand_lp = [[-math.inf if t == mask_id else v
                for t, v in zip(cand[d], values[at + d * width : at + (d + 1) * width])] for d in range(depth)]
    return trees.beam_paths(shape, cand, cand_lp) + [list(c) for c in extra]


class TreeBranches:
    """The branches of a tree of widths `shape` (per depth) beside its main chain: candidates at as many
    depths as the masks behind the draft reach. The mask token is never a candidate."""

    source = "masks"

    def __init__(self, shape: Sequence[int], mask_id: int):
        self.shape, self.mask_id = tuple(shape), int(mask_id)
        self.depth = self.top = 0  # depths and candidates per depth of the last `values`

    @property
    def width(self) -> int:
        return 2 * self.depth * self.top

    def values(self, seen: Seen) -> list[torch.Tensor]:
        masks = seen.masks
        self.depth = min(len(self.shape), masks.shape[0])
        self.top = min(max(self.shape[: self.depth], default=0), masks.shape[-1])
        if not (self.depth and self.top):
            self.depth = self.top = 0
            return []
        return candidates(masks, self.depth, self.top)

    def propose(self, values: Sequence[float], seen: Seen | None = None) -> list[list[int]]:
        if not self.depth:
            return []
        return branches(self.shape, values, self.depth, self.top, self.mask_id)
