"""Tree drafts for sbd-verify (SPEC §7, docs/method.md): small pure functions on host lists.

A chain draft is one guess per position; when its first token is wrong the forward yields one token.
The masks give more than one guess per position (their top-c candidates), and prompt lookup may give
another chain, so a verifying forward can carry a small tree of continuations instead: every node is
checked by the next-token head in the same forward, and the longest path that greedy decoding itself
would produce is kept.

A tree is a parent list over its nodes: node 0 is the head (the verified token not yet in the cache),
`parents[i] < i` for the others, `parents[0] = -1`. Its attention mask is `sbd.masks.tree_mask`. The
nodes are ordered depth first with the main chain (the one the masks follow) visited last at every
node, so the main chain ends at the LAST node: the rule "the block after the committed part follows the
last committed token" is then all the engine needs to know (it is the chain rule too).

Which nodes: a declared shape of widths per depth (w_1, w_2, …), e.g. (3, 2, 1): at depth d the tree
holds the w_d most likely extensions of the nodes kept at depth d − 1 by the masks' top-w_d tokens
at that position, scored by the sum of the masks' log-probabilities along the path (positions treated
as independent, as the masks predict them). The all-top-1 path scores highest at every depth, so the
masks' own chain is always in the tree; past the declared depths only the chains (masks' top-1,
lookup's) go on.
"""

from __future__ import annotations

import heapq
from typing import Sequence

from ..errors import SBDError

MAX_WIDTH = 32  # candidates per depth (a top-k on the device)
MAX_DEPTHS = 64


def check_shape(tree) -> tuple[int, ...] | None:
    """A tree shape as given by a user (None, a sequence of widths, or "3,2,1") → a tuple of widths per
    depth, each 1..MAX_WIDTH; SBDError in one line otherwise."""
    if tree is None:
        return None
    text = tree
    if isinstance(tree, str):
        try:
            tree = [int(x) for x in tree.replace(" ", "").split(",")]
        except ValueError:
            raise SBDError(f"tree is a list of widths per depth such as 3,2,1, got {text!r}") from None
    ok = isinstance(tree, (list, tuple)) and 0 < len(tree) <= MAX_DEPTHS and all(
        isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= MAX_WIDTH for w in tree)
    if not ok:
        raise SBDError(f"tree is a list of 1 to {MAX_DEPTHS} widths per depth, each an integer from 1 to "
                       f"{MAX_WIDTH} (such as 3,2,1), got {text!r}")
    return tuple(tree)


def max_nodes(widths: Sequence[int], depth: int, lookup: int | None = None) -> int:
    """The most nodes a tree of this shape can hold: the head, the masks' top-1 chain of at most `depth`
    tokens, lookup's chain of at most `lookup` tokens (None: `depth`, 0: no lookup) and the declared
    widths down to `depth`. A bound for cache room and width."""
    return 1 + depth + (depth if lookup is None else lookup) + sum(widths[:depth])


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node (a node hanging from the prefix, parent -1, has depth 0); the position id of
    node i is prefix length + depth[i]."""
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def children(parents: Sequence[int]) -> list[list[int]]:
    """The children of every node, in node order."""
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


def beam_paths(widths: Sequence[int], tokens: Sequence[Sequence[int]],
               logprobs: Sequence[Sequence[float]]) -> list[list[int]]:
    """The declared shape filled from the masks' candidates: token paths from the head, all depths.

    tokens[d] / logprobs[d]: the masks' candidates for draft depth d + 1, best first (at least
    widths[d] of them where that depth is declared). At depth d the paths kept at depth d − 1 are
    extended by each of the top widths[d] candidates and the widths[d] best by summed log-probability
    are kept (ties: the lower ranks). Candidates with log-probability −inf (the mask token) never enter.
    """
    kept: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]  # (score, ranks)
    out: list[list[int]] = []
    for d in range(min(len(widths), len(tokens))):
        w = widths[d]
        options = [(score + logprobs[d][r], ranks + (r,)) for score, ranks in kept
                   for r in range(min(w, len(tokens[d]))) if logprobs[d][r] != float("-inf")]
        kept = heapq.nsmallest(w, options, key=lambda o: (-o[0], o[1]))
        if not kept:
            break
        out += [[tokens[i][r] for i, r in enumerate(ranks)] for _, ranks in kept]
    return out


def build_tree(head: int, main: Sequence[int], branches: Sequence[Sequence[int]] = ()) -> tuple[list[int], list[int]]:
    """The tree of one verifying forward: (tokens, parents), tokens[0] = head.

    `main`: the chain the masks follow (lookup's when it found one, else the masks' top-1 chain);
    `branches`: other token paths from the head. Paths are merged where they share a prefix (no two
    children of a node hold the same token, so the greedy walk has one way to go), and the nodes are
    ordered depth first, other branches in the order given and the main chain last at every node, so
    that the last node is the main chain's end (or the end of a branch that continues the main chain:
    the block follows the last node either way; module docstring)."""
    toks, kids = [head], [{}]  # a trie: per node, token -> child

    def insert(path) -> list[int]:
        at, nodes = 0, []
        for t in path:
            t = int(t)
            if t not in kids[at]:
                kids[at][t] = len(toks)
                toks.append(t)
                kids.append({})
            at = kids[at][t]
            nodes.append(at)
        return nodes

    spine = set(insert(main))
    for b in branches:
        insert(b)
    order, parents, new = [], [], {}
    stack = [(0, -1)]
    while stack:  # pre-order; the spine child is pushed first, so it is visited last
        node, parent = stack.pop()
        new[node] = len(order)
        order.append(node)
        parents.append(parent)
        below = sorted(kids[node].values(), key=lambda c: (c not in spine, -c))  # spine, then others last-first
        stack += [(c, new[node]) for c in below]
    return [toks[n] for n in order], parents


def greedy_walk(tokens: Sequence[int], parents: Sequence[int], next_tokens: Sequence[int]) -> list[int]:
    """The nodes greedy decoding keeps: from the root, follow the child whose token equals the next-token
    head's argmax at its parent (`next_tokens[i]`: the argmax at node i), as long as there is one.
    Returns the kept nodes, the root first; the row then adds `next_tokens[path[-1]]`, the head's own
    next token (the correction, or a bonus token at a leaf)."""
    kids = children(parents)
    path = [0]
    while True:
        want = next_tokens[path[-1]]
        nxt = next((c for c in kids[path[-1]] if tokens[c] == want), None)
        if nxt is None:
            return path
        path.append(nxt)


def compaction(path: Sequence[int]) -> list[int]:
    """The committed feed positions that stay in the cache after a tree forward: the kept path, in feed
    order (a node comes after its parent, so that is the path's own order). The engine moves their
    keys and values to the front, contiguously, so the cache is again a causal prefill of the tokens."""
    return sorted(path)
