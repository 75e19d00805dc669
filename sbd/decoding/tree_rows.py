"""sbd-verify with tree drafts (greedy, draft "block" or "adaptive"; `spec.tree`: widths per depth, e.g.
(3, 2, 1)).

The verifying forward feeds [head | tree | masks] instead of [head | chain | masks]. The tree holds the
chain of today (lookup's when it finds one, else the masks' top-1, or the sampler head's) as its main
chain, which the masks follow, plus the declared shape filled from the masks' top candidates
(`TreeBranches`) and, with lookup, the masks' chain as another branch (`sbd.decoding.trees`). The greedy
walk keeps the longest path whose every token is the next-token head's argmax at its parent, plus the
head's next token; only that path stays in the cache (a compaction the engine makes). `accepted` counts
the kept draft nodes per forward, `proposed` the nodes put up; the adaptive rule prices the branches'
width too (`DraftPolicy`).
"""

from __future__ import annotations

import torch

from ..masks import tree_mask
from . import trees
from .forward import Feed
from .processing import token_logprobs
from .proposers.base import Seen
from .proposers.tree import TreeBranches
from .rows import VerifyRow


class TreeRow(VerifyRow):
    """A `VerifyRow` whose drafts are trees (module docstring): its own feed, ask and answer; drafting,
    lookup and the policy are the verifying row's."""

    def __init__(self, spec, prompt, *, mask_id: int, cost=None, **kw):
        super().__init__(spec, prompt, mask_id=mask_id, cost=cost, **kw)
        self.tree_branches = TreeBranches(self.tree, self.mask_id)
        self.branches: list[list[int]] = []  # token paths from the head besides the main chain (the draft)
        self._fed: tuple[list[int], list[int], int] | None = None  # (tokens, parents, masks) fed

    def feed(self) -> Feed:
        if self.in_prefill:
            return super().feed()
        room, masks = self._room(), self._masks()
        self.draft = self.draft[:room]
        tokens, parents = trees.build_tree(self.head, self.draft, [b[:room] for b in self.branches])
        self._fed = (tokens, parents, masks)
        chain = all(p == i - 1 for i, p in enumerate(parents))  # no branch: the engine's plain layout
        n = len(tokens)
        return Feed(tokens + [self.mask_id] * masks, n, n + masks, None if chain else parents)

    def ask(self, logits: torch.Tensor, drafting=None) -> torch.Tensor:
        """The next-token argmax at every node, the masks' chain and, for the declared depths, the masks'
        top candidates with their log-probabilities."""
        tokens, parents, _ = self._fed
        n = len(tokens)
        ntp, masks = logits[:n], logits[n:]
        masks[:, self.mask_id] = torch.finfo(masks.dtype).min  # never draft the mask token
        target = ntp
        if self.processing is not None:  # penalties count each node's own ancestors (and itself)
            fed = torch.tensor(tokens[1:], dtype=torch.long, device=logits.device)
            target = self._next_token_logits(ntp, fed, tree_mask(parents).to(logits.device))
        nxt = target.argmax(-1)
        self.chain = self.chains[drafting is not None]  # the masks' argmax or the sampler head's
        self.chain.cut = False  # a tree's chain is never cut by confidence
        seen = Seen(masks[1:], n + 1, nxt[-1], drafting)
        parts = [nxt.double(), *self.chain.values(seen), *self.tree_branches.values(seen)]
        if self.logprobs is not None:
            parts.append(token_logprobs(ntp, nxt, self.top_logprobs).flatten())
        return torch.cat(parts)

    def answer(self, values: list[float]) -> int | list[int]:
        """Greedy walk over the tree fed; returns the committed feed positions that stay (the kept path)."""
        if self.in_prefill:
            return super().answer(values)
        self.nfe += 1
        tokens, parents, _ = self._fed
        n, w = len(tokens), self._logprob_width()
        values, lp_values = (values[: -n * w], values[-n * w :]) if w else (values, [])
        nxt = [int(v) for v in values[:n]]
        chain = self.chain.propose(values[n:])
        candidates = values[n + self.chain.width :]  # after the chain: the masks' top candidates
        path = trees.greedy_walk(tokens, parents, nxt)
        a = len(path) - 1
        new = [tokens[i] for i in path[1:]] + [nxt[path[-1]]]
        if w:  # the logprob values of the kept path's nodes, in its order
            lp_values = [v for i in path for v in lp_values[i * w : (i + 1) * w]]
        if self.from_lookup:  # kept tokens along lookup's chain
            self.lookup_accepted += next((i for i, (x, y) in enumerate(zip(new[:a], self.draft)) if x != y),
                                         min(a, len(self.draft)))
        self._verified(a, n - 1, bool(trees.children(parents)[path[-1]]))  # refused: a child of the last kept node
        start = self._take(new, lp_values)
        end = self._end(start, new)
        if end is not None:
            self._finish(end)
            return trees.compaction(path)
        self.head = new[-1]
        was_lookup, self.from_lookup = self.from_lookup, False
        if path[-1] == n - 1:  # the masks followed the kept path: they draft the next tree
            self._next_draft(chain)
            self.branches = self.tree_branches.propose(candidates) + ([chain] if self.from_lookup else [])
        else:  # the masks followed a refused branch: the main chain's places after the kept path remain
            self._next_draft(self._leftover(a, new[-1], was_lookup))
            self.branches = []
        return trees.compaction(path)
