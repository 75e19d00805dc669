"""One prompt being decoded: its method, budget, stop rule and random stream (docs/method.md §3).

A row is a small state machine driven by the engine (`sbd.decoding.engine`): `feed()` says what goes
into the next forward, `ask(logits)` returns the device values the row must see on the host (read once
per step for all rows together), `answer(values)` takes the decision and returns how many committed
tokens leave the cache again (a rejected draft), or which committed feed positions stay (a list: a tree
draft keeps one path). All bookkeeping is on small host lists.

- `Row` (`sbd.decoding.row`): what every row shares.
- `NTPRow`: prefill all but the last prompt token, then one token per forward.
- `SBDRow`: the prompt is prefilled; each block starts as masks and is revealed by the EB rule (§4); a
  finished block is committed in the first forward of the next one.
- `VerifyRow` (sbd-verify, lossless): every forward feeds [head | draft | masks]; the model's own
  next-token predictions keep the longest draft prefix NTP would produce plus NTP's next token (greedy:
  the same tokens; sampling: speculative acceptance, the same distribution), and the masks draft the
  next block. Every forward yields at least one token. With `tree` (greedy) the draft is a small tree
  of candidate continuations (`sbd.decoding.trees`) and the longest path greedy decoding would produce
  is kept.
- `AnchoredRow` (`sbd.decoding.anchored`): plain SBD anchored on the next-token head.

Every row is built from a `DecodeSpec` (`sbd.decoding.spec`, which decided what goes together) and what
the spec cannot know: the prompt, the mask token, EOS ids, the tokenizer (stop strings), the seed and the
device (`make_row` picks the class). NTP and sbd-verify rows apply the spec's `Processing` (logit_bias,
penalties, top_p, logprobs; `sbd.decoding.processing`): it acts on the next-token head only, on the
device inside `ask()`.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..masks import tree_mask
from ..sampler import entropy_and_argmax, error_proxy, pick_tokens
from . import trees
from .anchored import AnchoredRow
from .draft_policy import DraftPolicy
from .forward import Feed
from .processing import pick, target_probs, token_logprobs
from .proposers import tree as tree_branches
from .proposers.chain import MaskChain, leftover_draft
from .proposers.lookup import LookupIndex
from .row import Row


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


class NTPRow(Row):
    """Plain next-token decoding: one token per forward."""

    def __init__(self, spec, prompt, *, mask_id: int | None = None, cost=None, **kw):
        super().__init__(spec, prompt, **kw)
        self.in_prefill = len(self.prompt) > 1
        self.last = self.prompt[-1]

    def feed(self) -> Feed:
        if self.in_prefill:
            return Feed(self.prompt[:-1], len(self.prompt) - 1, 0)
        return Feed([self.last], 1, 1)

    def ask(self, logits: torch.Tensor) -> torch.Tensor:
        if self.processing is None:
            tok = pick_tokens(logits, self.temperature, self.gen)
        else:
            tok = pick(self._next_token_logits(logits), self.temperature, self.processing.top_p, self.gen)
        if self.logprobs is None:
            return tok
        return torch.cat([tok.double(), token_logprobs(logits, tok, self.top_logprobs).flatten()])

    def answer(self, values: list[float]) -> int:
        if self.in_prefill:
            self.in_prefill = False
            return 0
        tok = int(values[0])
        self.nfe += 1
        start = self._take([tok], values[1:])
        end = self._end(start, [tok])
        if end is not None:
            self._finish(end)
        self.last = tok
        return 0


class SBDRow(Row):
    """Set Block Decoding with the EB rule (gamma, proxy); `fixed` reveals the first `fixed` masked
    positions per forward instead (a timing schedule, not a decoding rule)."""

    def __init__(self, spec, prompt, *, mask_id: int, cost=None, **kw):
        super().__init__(spec, prompt, **kw)
        block_size, gamma, fixed = spec.block_size, float(spec.gamma), spec.reveal_per_forward
        self.block_size, self.mask_id, self.gamma, self.proxy, self.fixed = block_size, int(mask_id), gamma, spec.proxy, fixed
        self.needs_extra = block_size
        self.any_order = math.isinf(gamma) or fixed is not None  # no entropies needed
        self.in_prefill = True
        self.pending: list[int] = []
        self._new_block()

    def _new_block(self) -> None:
        self.k = min(self.block_size, self.max_new - len(self.out))
        self.block = [self.mask_id] * self.k
        self.masked = [True] * self.k
        self.when = [0] * self.k

    def final_tokens(self) -> list[int]:
        if self.finished:
            return self.out
        known = next((i for i, m in enumerate(self.masked) if m), self.k)
        return self.out + self.block[:known]

    def feed(self) -> Feed:
        if self.in_prefill:
            return Feed(self.prompt, len(self.prompt), 0)
        return Feed(self.pending + self.block, len(self.pending), self.k)

    def ask(self, logits: torch.Tensor) -> torch.Tensor:
        logits[:, self.mask_id] = torch.finfo(logits.dtype).min  # never reveal the mask token itself
        if self.any_order:
            return pick_tokens(logits, self.temperature, self.gen)
        if self.temperature > 0:
            h, picked = error_proxy(logits, "entropy"), pick_tokens(logits, self.temperature, self.gen)
        else:
            h, picked = entropy_and_argmax(logits)  # the EB bound is on entropies whatever the proxy
        parts = [picked.double(), h.double()]
        if self.proxy != "entropy":
            parts.append(error_proxy(logits, self.proxy).double())
        return torch.cat(parts)

    def answer(self, values: list[float]) -> int:
        if self.in_prefill:
            self.in_prefill = False
            return 0
        k = self.k
        self.pending = []  # committed in this forward
        picked = [int(v) for v in values[:k]]
        h = values[k : 2 * k]
        order = values[2 * k : 3 * k] if self.proxy != "entropy" and not self.any_order else None
        # Positions after the first EOS that the block holds (revealed) or predicts (masked) are not
        # revealed: if that EOS stands they are discarded, so a forward spent on them is wasted.
        todo, seen_eos = [], False
        for i in range(k):
            todo.append(self.masked[i] and not seen_eos)
            seen_eos = seen_eos or (picked[i] if self.masked[i] else self.block[i]) in self.eos
        if self.fixed is not None:
            reveal = [i for i in range(k) if todo[i]][: self.fixed]
        elif self.any_order:
            reveal = [i for i in range(k) if todo[i]]
        else:
            reveal = eb_rule(h, todo, self.gamma, order)
        self.nfe += 1
        for i in reveal:
            self.block[i], self.masked[i], self.when[i] = picked[i], False, self.nfe
        known = next((i for i, m in enumerate(self.masked) if m), k)
        start = len(self.out)
        end = self._end(start, self.block[:known]) if known else None
        if end is not None and end <= start + known:
            self.out += self.block[:known]
            self.steps += self.when[:known]
            self._finish(end)
        elif known == k:  # the block is complete: it is committed by the next forward
            self.out += self.block
            self.steps += self.when
            self.pending = self.block
            self._new_block()
        return 0


def verify_width(block_size: int, lookup_max: int = 0, tree: Sequence[int] | None = None) -> int:
    """The widest forward of an sbd-verify row (cache positions it writes past its committed part): a
    forward verifying a lookup draft (at most `lookup_max`; 0 without lookup) feeds no masks; any other
    feeds a draft of at most block − 1 (a tree of that depth) and block masks."""
    if tree is None:
        return max(2 * block_size + 1, 1 + lookup_max)
    return max(trees.max_nodes(tree, block_size - 1) + block_size + 1,
               trees.max_nodes(tree, block_size - 1, lookup_max))


def accept_sampled(p, draft, q_draft, gen):
    """Speculative acceptance for one row: accepted length and the token at each position if drawn
    there: the draft token where accepted, the residual sample at the first rejection, a sample of p
    after the last draft token. p (n + 1, V) the target distributions after each causal position (the
    next-token head's, processed and at the temperature), draft (n,), q_draft (n, V)."""
    n = draft.shape[0]
    tokens = torch.empty(n + 1, dtype=torch.long, device=draft.device)
    accepted = torch.zeros(1, dtype=torch.long, device=draft.device)
    if n:
        p_d = p[:n].gather(-1, draft[:, None]).squeeze(-1)
        q_d = q_draft.gather(-1, draft[:, None]).squeeze(-1)
        u = torch.rand(p_d.shape, generator=gen, device=draft.device)
        ok = (u * q_d <= p_d).long().cumprod(-1)  # u < p/q without dividing by a zero q
        accepted = ok.sum(-1, keepdim=True)
        residual = (p[:n] - q_draft).clamp_min(0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p[:n])
        fix = torch.multinomial(residual, 1, generator=gen).squeeze(-1)
        tokens[:n] = torch.where(ok.bool(), draft, fix)
    tokens[n] = torch.multinomial(p[n], 1, generator=gen).squeeze(-1)
    return accepted, tokens


class VerifyRow(Row):
    """sbd-verify (module docstring): verify a draft, commit what stands, and ask the drafters for the
    next one. What is drafted comes from the drafters (`sbd.decoding.proposers`); how long, and from
    which source, from the row's `DraftPolicy` (`sbd.decoding.draft_policy`), the same policy the vLLM
    proposer holds per request, with the spec's drafting switches (`DraftOptions`).

    eb_gamma None: the draft is the whole block the masks predicted; a number: the draft is first
    revealed by the EB rule over forwards of its own (greedy only). cost (draft "adaptive"): a function
    width → relative forward time (`sbd.decoding.width_cost`); after every verifying forward the policy
    picks how many masks to feed next (at most block_size) from the row's acceptance so far
    (`best_draft_length`). When no draft pays, the row takes plain next-token steps and tries a one-token
    draft every `DraftOptions.probe_every` forwards to notice when drafting starts to pay again. None
    drafts whole blocks. Either way the tokens are NTP's.

    tree (greedy, draft "block" or "adaptive"): widths per depth, e.g. (3, 2, 1): the verifying forward
    feeds [head | tree | masks] instead of [head | chain | masks]. The tree holds the chain of today
    (lookup's when it finds one, else the masks' top-1) as its main chain, which the masks follow, plus
    the declared shape filled from the masks' top candidates and, with lookup, the masks' chain as
    another branch (`sbd.decoding.trees`). The greedy walk keeps the longest path whose every token is
    the next-token head's argmax at its parent, plus the head's next token; only that path stays in the
    cache (a compaction). `accepted` counts the kept draft nodes per forward, `proposed` the nodes put
    up. The adaptive rule prices the branches' width too.

    lookup (greedy): the draft is prompt lookup's when it finds a match (`LookupIndex`, at most
    `lookup_max` tokens), else the masks'. A forward that verifies a
    lookup draft, chain or tree, feeds no masks: they would only draft the next forward if every draft
    token stood, and then lookup drafts it again (`feed`).

    Sampler head (`sbd.drafters.sampler_head`; greedy whole-block or adaptive drafts, chain or tree): when the
    engine hands `ask` a `Drafting`, the masks' chain (the next draft, or a tree's main chain) is drawn
    by the head instead of the masks' argmax: each position rescored among the masks' top candidates
    given the token chosen before it. Branches stay the masks' own candidates. Sampling and draft="eb"
    never use the head (`drafts_with_head`): a sampled draft must be drawn from the distribution q the
    acceptance rule divides by, which is the masks' own."""

    def __init__(self, spec, prompt, *, mask_id: int, cost=None, **kw):
        super().__init__(spec, prompt, **kw)
        # which settings go together was decided where the spec was resolved (`sbd.decoding.spec`)
        self.options = options = spec.draft_options
        self.tree = trees.check_shape(spec.tree)
        block_size, eb_gamma, lookup, lookup_max = spec.block_size, spec.eb_gamma, spec.lookup, spec.lookup_max
        self.block_size, self.mask_id, self.eb_gamma, self.proxy = block_size, int(mask_id), eb_gamma, spec.proxy
        self.cost = cost = cost if spec.draft == "adaptive" else None
        # fallback: whole-block greedy drafts only (`DraftPolicy.fall_back`)
        self.policy = DraftPolicy(block_size, options, tree=self.tree or (),
                                  fallback=spec.fallback and cost is None and eb_gamma is None and self.temperature <= 0)
        self.lookup = lookup  # greedy: draft from an earlier occurrence of the last tokens when there is one
        self.lookup_max = lookup_max  # the longest lookup draft
        self.lookup_index = LookupIndex(self.prompt) if lookup else None
        self.from_lookup = False  # the current draft came from prompt lookup
        self.needs_extra = verify_width(block_size, lookup_max if lookup else 0, self.tree)
        self.chain = MaskChain()  # the masks' chain asked for in the last `ask`
        self.branches: list[list[int]] = []  # tree: token paths from the head besides the main chain (the draft)
        self._fed: tuple[list[int], list[int], int] | None = None  # tree: (tokens, parents, masks) fed
        self._top = (0, 0)  # tree: (depths, candidates per depth) of the masks' top tokens asked for
        self.in_prefill = len(self.prompt) > 1
        self.head = self.prompt[-1]
        self.draft: list[int] = []
        self.q_draft: torch.Tensor | None = None  # sampling: the masked distribution of the draft
        self.q_next = self.next_draft = None
        self.refining: list[int] | None = None  # eb: the block being revealed, [head, ...]
        self.masked: list[bool] = []

    @property
    def drafts_with_head(self) -> bool:
        """Whether this row drafts with a sampler head when the model has one: greedy block/adaptive drafts."""
        return self.temperature <= 0 and self.eb_gamma is None

    @property
    def rejections(self) -> int:
        """Verifying forwards in which a draft token was refused."""
        return self.policy.rejections

    def _chain_values(self, masks: torch.Tensor, drafting, at: int, first: torch.Tensor) -> torch.Tensor:
        """The masks' chain for the next draft (positions 2.. of the masks, `masks`; `MaskChain.values`);
        adaptive chains are cut by the drafter's confidence, so its probabilities are sent along."""
        probs = self.cost is not None and self.tree is None and self.options.cuts_chains(drafting is not None)
        return self.chain.values(masks, drafting, at, first, probs)

    def _read_chain(self, values) -> list[int]:
        """The chain from the values `_chain_values` produced (they lead `values`)."""
        return self.chain.propose(values)

    def feed(self) -> Feed:
        if self.in_prefill:
            return Feed(self.prompt[:-1], len(self.prompt) - 1, 0)
        if self.refining is not None:
            return Feed(self.refining, 0, self.block_size)
        room = max(0, self.max_new - len(self.out) - 1)  # a forward yields at most n_draft + 1 tokens
        # The masks only draft the next forward, and only when its lookup finds nothing. A lookup draft's
        # occurrence always continues past it (what follows the match, then its repeat: `LookupIndex`), so
        # if every draft token stands the next draft comes from lookup again: no masks beside it.
        masks = 0 if self.from_lookup else self.policy.n_masks
        if self.tree is not None:
            self.draft = self.draft[:room]
            tokens, parents = trees.build_tree(self.head, self.draft, [b[:room] for b in self.branches])
            self._fed = (tokens, parents, masks)
            chain = all(p == i - 1 for i, p in enumerate(parents))  # no branch: the engine's plain layout
            n = len(tokens)
            return Feed(tokens + [self.mask_id] * masks, n, n + masks, None if chain else parents)
        if len(self.draft) > room:
            self.draft = self.draft[:room]
            self.q_draft = self.q_draft[:room] if self.q_draft is not None else None
        n = len(self.draft)
        return Feed([self.head] + self.draft + [self.mask_id] * masks, 1 + n, 1 + n + masks)

    def _next_draft(self, masks_draft: list[int]) -> None:
        """The next draft: prompt lookup's continuation when lookup is on and finds one, as long as the
        policy says pays (`DraftPolicy.lookup_length`), else the masks'."""
        found = self.lookup_index.propose(self.out, self.lookup_max) if self.lookup else []
        found = found[: self.policy.lookup_length(len(found), self.cost)]
        self.draft, self.from_lookup = (found, True) if found else (masks_draft, False)

    def _record(self, kept: int, refused: bool) -> None:
        """One verifying forward's outcome, in the record of the source of its draft."""
        self.policy.record("lookup" if self.from_lookup else "masks", kept, refused)

    def _adapt(self) -> None:
        """The next forward's mask count from the acceptance so far (`DraftPolicy.adapt`)."""
        self.policy.adapt(self.cost)

    def _mask_values(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """What the EB rule needs from block logits: picked tokens, entropies (and the proxy)."""
        h, picked = entropy_and_argmax(logits)
        parts = [picked.double(), h.double()]
        if self.proxy != "entropy":
            parts.append(error_proxy(logits, self.proxy).double())
        return parts

    def ask(self, logits: torch.Tensor, drafting=None) -> torch.Tensor:
        """drafting: a `sbd.drafters.sampler_head.Drafting` (the engine passes one when the model has an enabled
        sampler head and `drafts_with_head`): the next draft's chain comes from the head."""
        self.chain.table = 0
        if self.refining is not None:
            logits[:, self.mask_id] = torch.finfo(logits.dtype).min
            return torch.cat(self._mask_values(logits))
        if self.tree is not None:
            return self._ask_tree(logits, drafting)
        n = len(self.draft)
        ntp, masks = logits[: 1 + n], logits[1 + n :]
        masks[:, self.mask_id] = torch.finfo(masks.dtype).min  # never draft the mask token
        draft = None
        if self.temperature > 0 or self.processing is not None:
            draft = torch.tensor(self.draft, dtype=torch.long, device=logits.device)
        # the verifying head: at position j the penalties count the draft tokens before j
        target = ntp if self.processing is None else self._next_token_logits(ntp, draft)
        if self.temperature > 0:
            p = target_probs(target, self.temperature, self.processing.top_p if self.processing else 1.0)
            accepted, tokens = accept_sampled(p, draft, self.q_draft, self.gen)
            # the next draft, used only if every draft token stands (positions 2.. of the masks)
            self.q_next = torch.softmax(masks[1:].float() / self.temperature, dim=-1)
            nxt = torch.multinomial(self.q_next, 1, generator=self.gen).squeeze(-1) if len(self.q_next) else tokens[:0]
            parts = [accepted.double(), tokens.double(), nxt.double()]
        else:
            tokens = target.argmax(-1)
            parts = [tokens.double()]
            if self.eb_gamma is not None:
                parts += self._mask_values(masks)
            else:
                parts.append(self._chain_values(masks[1:], drafting, 2 + n, tokens[-1]))
        if self.logprobs is not None:  # for every position: the token kept there, if it is kept
            parts.append(token_logprobs(ntp, tokens, self.top_logprobs).flatten())
        return torch.cat(parts)

    def _reveal(self, values: list[float]) -> None:
        """One EB step on the block being refined; done when nothing is masked."""
        k = self.block_size
        picked, h = [int(v) for v in values[:k]], values[k : 2 * k]
        order = values[2 * k : 3 * k] if self.proxy != "entropy" else None
        for i in eb_rule(h, self.masked, self.eb_gamma, order):
            self.refining[i], self.masked[i] = picked[i], False
        if not any(self.masked):
            self.draft, self.refining = self.refining[1:], None

    def _ask_tree(self, logits: torch.Tensor, drafting=None) -> torch.Tensor:
        """Greedy, tree fed: the next-token argmax at every node, the masks' top-1 chain and, for the
        declared depths, the masks' top candidates with their log-probabilities."""
        tokens, parents, n_masks = self._fed
        n = len(tokens)
        ntp, masks = logits[:n], logits[n:]
        masks[:, self.mask_id] = torch.finfo(masks.dtype).min  # never draft the mask token
        target = ntp
        if self.processing is not None:  # penalties count each node's own ancestors (and itself)
            fed = torch.tensor(tokens[1:], dtype=torch.long, device=logits.device)
            target = self._next_token_logits(ntp, fed, tree_mask(parents).to(logits.device))
        nxt = target.argmax(-1)
        depth = min(len(self.tree), max(0, n_masks - 1))
        width = min(max(self.tree[:depth], default=0), masks.shape[-1])
        self._top = (depth, width)
        parts = [nxt.double(), self._chain_values(masks[1:], drafting, n + 1, nxt[-1])]
        if depth and width:
            parts += tree_branches.values(masks[1:], depth, width)
        if self.logprobs is not None:
            parts.append(token_logprobs(ntp, nxt, self.top_logprobs).flatten())
        return torch.cat(parts)

    def _answer_tree(self, values: list[float]) -> list[int]:
        """Greedy walk over the tree fed; returns the committed feed positions that stay (the kept path)."""
        tokens, parents, n_masks = self._fed
        n, (depth, width) = len(tokens), self._top
        lp = n * self._logprob_width()
        values, lp_values = (values[:-lp], values[-lp:]) if lp else (values, [])
        nxt = [int(v) for v in values[:n]]
        chain = self._read_chain(values[n:])
        candidates = values[n + self.chain.width :]  # after the chain: the masks' top candidates
        path = trees.greedy_walk(tokens, parents, nxt)
        a = len(path) - 1
        new = [tokens[i] for i in path[1:]] + [nxt[path[-1]]]
        if lp:  # the logprob values of the kept path's nodes, in its order
            w = self._logprob_width()
            lp_values = [v for i in path for v in lp_values[i * w : (i + 1) * w]]
        self.accepted.append(a)
        if self.from_lookup:  # kept tokens along lookup's chain
            self.lookup_accepted += next((i for i, (x, y) in enumerate(zip(new[:a], self.draft)) if x != y),
                                         min(a, len(self.draft)))
        self.proposed += n - 1
        self._record(a, bool(trees.children(parents)[path[-1]]))  # refused: a child of the last kept node
        self._adapt()
        start = self._take(new, lp_values)
        end = self._end(start, new)
        if end is not None:
            self._finish(end)
            return trees.compaction(path)
        self.head = new[-1]
        was_lookup, self.from_lookup = self.from_lookup, False
        if path[-1] == n - 1:  # the masks followed the kept path: they draft the next tree
            self._next_draft(chain)
            self.branches = tree_branches.propose(self.tree, candidates, depth, width, self.mask_id,
                                                  [chain] if self.from_lookup else [])
        else:  # the masks followed a refused branch: the main chain's places after the kept path remain
            self._next_draft(self._leftover(a, new[-1], was_lookup))
            self.branches = []
        return trees.compaction(path)

    def _leftover(self, kept: int, next_token: int, was_lookup: bool) -> list[int]:
        """The next draft after a refusal when lookup finds none: the refused masks' draft's later places
        (`leftover_draft`, with `DraftOptions.reuse_leftover`; greedy only), no longer than the draft the
        row would feed now (adaptive drafting) or a block. A refused lookup draft leaves nothing: lookup
        itself looks again."""
        if not self.options.reuse_leftover or was_lookup or self.temperature > 0:
            return []
        longest = self.block_size - 1 if self.cost is None else max(0, self.policy.n_masks - 1)
        return leftover_draft(self.draft, kept, next_token)[:longest]

    def answer(self, values: list[float]) -> int | list[int]:
        if self.in_prefill:
            self.in_prefill = False
            self._next_draft([])
            return 0
        self.nfe += 1
        if self.refining is not None:
            self._reveal(values)
            return 0
        if self.tree is not None:
            return self._answer_tree(values)
        n, k = len(self.draft), self.block_size
        lp = (n + 1) * self._logprob_width()
        values, lp_values = (values[:-lp], values[-lp:]) if lp else (values, [])
        if self.temperature > 0:
            a = int(values[0])
            tokens = [int(v) for v in values[1 : n + 2]]
            rest = values[n + 2 :]
        else:
            tokens = [int(v) for v in values[: n + 1]]
            a = 0
            while a < n and self.draft[a] == tokens[a]:
                a += 1
            rest = values[n + 1 :]
        self.accepted.append(a)
        self.lookup_accepted += a if self.from_lookup else 0
        self.proposed += n
        self._record(a, a < n)
        self._adapt()
        new = tokens[: a + 1]  # draft tokens kept (they equal NTP's) + NTP's next token
        start = self._take(new, lp_values)
        end = self._end(start, new)
        if end is not None:
            self._finish(end)
            return n - a
        self.head = new[-1]
        self.q_draft = None
        was_lookup, self.from_lookup = self.from_lookup, False
        if a < n:  # the masks rode on a rejected draft: the rest of that draft is the next guess
            self._next_draft(self._leftover(a, new[-1], was_lookup))
        elif self.temperature > 0:
            self.draft, self.q_draft = [int(v) for v in rest], self.q_next
        elif self.eb_gamma is not None and k > 1:
            self.refining = [self.head] + [self.mask_id] * (k - 1)
            self.masked = [False] + [True] * (k - 1)
            self._reveal(rest)
        elif self.eb_gamma is not None:
            self.draft = []
        else:  # the masks' chain (the sampler head's, when it drew it)
            self._next_draft(self._read_chain(rest))
            if self.chain.probs is not None and not self.from_lookup:  # adaptive: as far as the drafter is sure
                self.draft = self.draft[: self.policy.confident(self.chain.probs, self.cost, self.policy.n_masks)]
        return n - a


def make_row(spec, prompt: list[int], *, mask_id: int | None, eos: Sequence[int] = (), tokenizer=None,
             seed: int | None = None, device=None, cost=None) -> Row:
    """The row that decodes `prompt` as `spec` says (a `sbd.decoding.spec.DecodeSpec`, checked where it was
    resolved): NTP, SBD (anchored or by the EB rule) or sbd-verify. cost: for draft "adaptive", width →
    relative forward time (`sbd.decoding.width_cost`). eos, tokenizer (stop strings), seed (sampling),
    device: what the spec cannot know."""
    if spec.method == "sbd":
        kind = AnchoredRow if spec.anchor else SBDRow
    else:
        kind = NTPRow if spec.method == "ntp" else VerifyRow
    return kind(spec, prompt, mask_id=mask_id, eos=eos, tokenizer=tokenizer, seed=seed, device=device, cost=cost)
