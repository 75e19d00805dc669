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

NTP and sbd-verify rows take a `Processing` (logit_bias, penalties, top_p, logprobs;
`sbd.decoding.processing`): it acts on the next-token head only, on the device inside `ask()`.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..errors import SBDError
from ..masks import tree_mask
from ..sampler import entropy_and_argmax, error_proxy, pick_tokens
from ..drafters.sampler_head import walk
from . import lookup, trees
from .anchored import AnchoredRow
from .engine import Feed
from .processing import Processing, pick, target_probs, token_logprobs
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

    def __init__(self, prompt, **kw):
        super().__init__(prompt, **kw)
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

    def __init__(self, prompt, *, block_size: int, mask_id: int, gamma: float = 0.35, proxy: str = "entropy",
                 fixed: int | None = None, **kw):
        super().__init__(prompt, **kw)
        self.block_size, self.mask_id, self.gamma, self.proxy, self.fixed = block_size, mask_id, gamma, proxy, fixed
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


def expected_tokens(alpha: float, d: int) -> float:
    """Tokens a verifying forward yields on average with a draft of d tokens, each standing with
    probability alpha once the one before it stood: the kept draft prefix plus the head's own token."""
    return 1 + (d * alpha if alpha >= 1 else alpha * (1 - alpha ** d) / (1 - alpha))


def best_draft_length(alpha: float, cost, longest: int, tree: Sequence[int] = ()) -> int:
    """The draft length d (0..longest) that maximises expected tokens per unit of forward time.

    A verifying forward with a draft of d ≥ 1 tokens feeds 1 + d + (d + 1) tokens (head, draft, and the
    masks that draft the next d) and costs `cost(2d + 2)` one-token forwards; if each draft token stands
    with probability alpha once the one before it stood, it yields 1 + alpha·(1 − alpha^d)/(1 − alpha)
    tokens on average. d = 0 is a plain next-token step (1 token for `cost(1)`), chosen when no draft
    pays for its width. tree: widths per depth of tree drafts, whose branches widen the forward by
    w − 1 tokens at each depth up to d (alpha is then the tree's rate per depth)."""
    best, value = 0, 1.0 / cost(1)
    for d in range(1, max(0, longest) + 1):
        v = expected_tokens(alpha, d) / cost(2 * d + 2 + sum(w - 1 for w in tree[:d]))
        if v > value + 1e-12:
            best, value = d, v
    return best


def best_lookup_length(alpha: float, cost, longest: int) -> int:
    """How many of a prompt-lookup continuation's `longest` tokens to put up (1..longest): the length that
    maximises expected tokens per unit of forward time. A forward verifying a lookup draft of d tokens
    feeds 1 + d tokens (head and draft, no masks) and costs `cost(d + 1)`; each draft token stands with
    probability alpha once the one before it stood (lookup's own record, not the masks'). At least one
    token, so that lookup's record keeps growing."""
    best, value = 1, -1.0
    for d in range(1, max(1, longest) + 1):
        v = expected_tokens(alpha, d) / cost(d + 1)
        if v > value + 1e-12:
            best, value = d, v
    return best


def confident_length(probs: Sequence[float], cost, masks: int, refusal: float) -> int:
    """How much of the masks' next draft to put up (0..len(probs)), from how sure the drafter is of each
    token: probs[i] is its drafting probability (the masks' softmax, or the sampler head's over the masks'
    top candidates), read as the chance that token i stands once the ones before it stood (calibrated
    closely enough on both shipped models: docs/performance.md, "Drafts cut by the drafter's confidence").

    A draft of t tokens yields 1 + Σ_{i≤t} P_i tokens on average (P_i = probs[0]·…·probs[i−1]); if one
    of them is refused (1 − P_t), the `masks` fed behind it drafted for the wrong places and the next
    forward has no draft, which costs about `refusal` more tokens. The forward feeds 1 + t + masks tokens
    and costs `cost(1 + t + masks)`. The t with the most tokens per unit of time wins. So a draft stops
    before the place where the drafter is unsure: the next-token head fills that place for free, and the
    masks behind the shorter draft stay in the right context."""
    best, keep, stands, expected = 1.0 / cost(1 + masks), 0, 1.0, 0.0
    for t, p in enumerate(probs, 1):
        stands *= p
        expected += stands
        value = (1 + expected - refusal * (1 - stands)) / cost(1 + t + masks)
        if value > best + 1e-12:
            best, keep = value, t
    return keep


def verify_width(block_size: int, lookup_max: int = 0, tree: Sequence[int] | None = None) -> int:
    """The widest forward of an sbd-verify row (cache positions it writes past its committed part): a
    forward verifying a lookup draft (at most `lookup_max`; 0 without lookup) feeds no masks; any other
    feeds a draft of at most block − 1 (a tree of that depth) and block masks."""
    if tree is None:
        return max(2 * block_size + 1, 1 + lookup_max)
    return max(trees.max_nodes(tree, block_size - 1) + block_size + 1,
               trees.max_nodes(tree, block_size - 1, lookup_max))


def leftover_draft(draft: Sequence[int], kept: int, next_token: int) -> list[int]:
    """A draft for the forward after a refused one, from the refused draft itself (greedy).

    The masks draft each block position from the committed prefix, not from the draft tokens before it,
    so the draft tokens after a refused one are guesses for the same places as before: with `kept` draft
    tokens kept and the model's `next_token` in place of draft[kept], the next places are those of
    draft[kept + 1:]. If the model's token is the one drafted a place later (the draft had one token too
    many), the rest from there on. Verification decides, so this only changes what is proposed."""
    rest = list(draft[kept + 1 :])
    if rest and rest[0] == next_token:
        return rest[1:]
    return rest


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
    """sbd-verify (module docstring). eb_gamma None: the draft is the whole block the masks predicted;
    a number: the draft is first revealed by the EB rule over forwards of its own (greedy only).
    cost (adaptive drafting): a function width → relative forward time (`sbd.decoding.width_cost`);
    after every verifying forward the row picks how many masks to feed next (at most block_size) from
    its own acceptance so far (`best_draft_length`). When no draft pays, it takes plain next-token
    steps and tries a one-token draft every `PROBE_EVERY` forwards to notice when drafting starts to
    pay again. None drafts whole blocks. Either way the tokens are NTP's.

    tree (greedy, draft "block" or "adaptive"): widths per depth, e.g. (3, 2, 1): the verifying forward
    feeds [head | tree | masks] instead of [head | chain | masks]. The tree holds the chain of today
    (lookup's when it finds one, else the masks' top-1) as its main chain, which the masks follow, plus
    the declared shape filled from the masks' top candidates and, with lookup, the masks' chain as
    another branch (`sbd.decoding.trees`). The greedy walk keeps the longest path whose every token is
    the next-token head's argmax at its parent, plus the head's next token; only that path stays in the
    cache (a compaction). `accepted` counts the kept draft nodes per forward, `proposed` the nodes put
    up. The adaptive rule prices the branches' width too.

    lookup (greedy): the draft is prompt lookup's when it finds a match (`_lookup`, at most
    `lookup_max` tokens, from an index kept over prompt + output), else the masks'. A forward that
    verifies a lookup draft, chain or tree, feeds no masks: they would only draft the next forward if
    every draft token stood, and then lookup drafts it again (`feed`).

    Sampler head (`sbd.drafters.sampler_head`; greedy whole-block or adaptive drafts, chain or tree): when the
    engine hands `ask` a `Drafting`, the masks' chain (the next draft, or a tree's main chain) is drawn
    by the head instead of the masks' argmax: each position rescored among the masks' top candidates
    given the token chosen before it. Branches stay the masks' own candidates. Sampling and draft="eb"
    never use the head (`drafts_with_head`): a sampled draft must be drawn from the distribution q the
    acceptance rule divides by, which is the masks' own."""

    PROBE_EVERY = 16
    # greedy: after a refusal, the refused draft's later places are the next draft (`leftover_draft`).
    # Off: measured worse on both models (the masks then ride on a draft that is often refused again,
    # instead of drafting afresh in the right context): demo block 8 3.68 vs 3.90 tokens per forward,
    # SmolLM2 chain 1.26 vs 1.41, tree 3,2 1.31 vs 1.58 (docs/results_smollm2.md).
    REUSE_LEFTOVER = False
    LOOKUP_NGRAMS = lookup.NGRAMS  # prompt lookup: match the last 3 tokens, else the last 2
    # The longest prompt-lookup draft. A lookup draft runs as long as its earlier occurrence does and is
    # fed without masks (`feed`), so it costs its own width only: 16 makes a lookup forward (1 + 16) no
    # wider than a verifying forward of the default block of 16 (2·16 + 1), so the default engine width
    # and cache room stay as they were, while copied spans (code, names, quoted text) are drafted 16 at
    # a time instead of block − 1 (Hugging Face's prompt lookup drafts 10).
    LOOKUP_MAX = 16
    # adaptive drafting, chains of the masks: the next draft is cut where the drafter is unsure
    # (`confident_length`); this many tokens is what a refused draft costs beyond itself. None: not cut
    # (before 2026-11-26, session 13). Measured: docs/performance.md, "Drafts cut by the drafter's confidence".
    REFUSAL_COST = 0.5
    # ... also the chains a sampler head draws (by its probability of each pick). Off: measured no faster
    # on SmolLM2 with its adapter (time 1.01x and 1.05x of not cut on gsm and the mixed set, interleaved).
    CUT_HEAD_CHAINS = False
    # adaptive drafting: a lookup draft only as long as pays on lookup's own record (`best_lookup_length`);
    # False drafts all `lookup_max` tokens whenever lookup finds them (before 2026-11-24, session 6)
    ADAPTIVE_LOOKUP = True
    # fallback (whole-block drafts of masks never trained for drafting): after this many refused drafts,
    # plain next-token steps while a draft token's estimated chance to stand stays under FALLBACK_ALPHA
    # (a whole-block draft forward then yields < 1.18 tokens, less than its width costs anywhere), with a
    # whole-block probe every PROBE_EVERY forwards to notice drafts that start to stand
    FALLBACK_AFTER = 8
    FALLBACK_ALPHA = 0.15

    def __init__(self, prompt, *, block_size: int, mask_id: int, eb_gamma: float | None = None,
                 proxy: str = "entropy", cost=None, lookup: bool = False, tree=None,
                 lookup_max: int = LOOKUP_MAX, fallback: bool = False, **kw):
        super().__init__(prompt, **kw)
        if not isinstance(lookup_max, int) or isinstance(lookup_max, bool) or lookup_max < 1:
            raise SBDError(f"lookup_max must be an integer >= 1, got {lookup_max!r}")
        self.tree = trees.check_shape(tree)
        if self.tree is not None and self.temperature > 0:
            raise SBDError("tree drafts are greedy only (temperature 0): the speculative acceptance of sampling "
                           "is implemented for one chain; use tree=None to sample")
        if self.tree is not None and eb_gamma is not None:
            raise SBDError("tree drafts apply to draft='block' or 'adaptive' (the masks' candidates of the "
                           "verifying forward), not draft='eb'")
        self.block_size, self.mask_id, self.eb_gamma, self.proxy = block_size, mask_id, eb_gamma, proxy
        self.cost = cost
        self.fallback = fallback and cost is None and eb_gamma is None  # whole-block drafts only (FALLBACK_AFTER)
        self.lookup = lookup  # greedy: draft from an earlier occurrence of the last tokens when there is one
        self.lookup_max = lookup_max  # the longest lookup draft
        self.from_lookup = False  # the current draft came from prompt lookup
        self.n_masks = block_size  # masks fed by the next verifying forward that verifies no lookup draft
        self.plain_steps = 0  # consecutive next-token steps (adaptive drafting found no draft worth its width)
        self.rejections = 0  # verifying forwards in which a draft token was refused
        # adaptive drafting's record per draft source: draft tokens kept, forwards with a refused draft token
        self.kept_by = {"masks": 0, "lookup": 0}
        self.refused_by = {"masks": 0, "lookup": 0}
        self.needs_extra = verify_width(block_size, lookup_max if lookup else 0, self.tree)
        # prompt lookup's index over prompt + output: per n-gram size g, the g tokens → the latest start
        # of an occurrence other than the sequence's own last g tokens (`_index_new_tokens`)
        self._seq = list(self.prompt)  # prompt + output as far as known
        self._indexed = 0  # the length of _seq when the index was last brought up to date
        self._index: dict[int, dict[tuple[int, ...], int]] = {g: {} for g in self.LOOKUP_NGRAMS}
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
        self._head_chain = 0  # values the sampler head's table took in the last `ask` (0: the masks' argmax)
        self._chain_m = 0  # tokens in the last `ask`'s chain
        self._sends_probs = False  # the last `ask` also sent each chain token's drafting probability
        self.chain_probs: list[float] | None = None  # those probabilities, read with the chain

    @property
    def drafts_with_head(self) -> bool:
        """Whether this row drafts with a sampler head when the model has one: greedy block/adaptive drafts."""
        return self.temperature <= 0 and self.eb_gamma is None

    def _chain_values(self, masks: torch.Tensor, drafting, at: int, first: torch.Tensor) -> torch.Tensor:
        """The masks' chain for the next draft (positions 2.. of the masks, `masks`): their argmax, or the
        sampler head's table (`sbd.drafters.sampler_head.draft_table`) when a `Drafting` is given. `at`: where
        `masks` starts among the row's logits; `first`: the next-token head's token before them."""
        self._head_chain, self._chain_m = 0, masks.shape[0]
        # adaptive chains are cut by the drafter's confidence (`confident_length`): send it along
        self._sends_probs = probs = (self.cost is not None and self.tree is None and self.REFUSAL_COST is not None
                                     and masks.shape[0] > 0 and (drafting is None or self.CUT_HEAD_CHAINS))
        if drafting is None or masks.shape[0] == 0:
            if not probs:
                return masks.argmax(-1).double()
            top = masks.float().softmax(-1).max(-1)
            return torch.cat([top.indices.double(), top.values.double()])
        table = drafting.table(masks, at, first, probs=probs)
        self._head_chain = table.numel()
        return table.double()

    def _read_chain(self, values) -> list[int]:
        """The chain from the values `_chain_values` produced (they lead `values`); its tokens' drafting
        probabilities, when they were sent, go to `chain_probs`."""
        m, self.chain_probs = self._chain_m, None
        if self._head_chain:
            if not self._sends_probs:
                return walk(values[: self._head_chain], m)
            chain, self.chain_probs = walk(values[: self._head_chain], m, probs=True)
            return chain
        if self._sends_probs:
            self.chain_probs = [float(v) for v in values[m : 2 * m]]
        return [int(v) for v in values[:m]]

    def feed(self) -> Feed:
        if self.in_prefill:
            return Feed(self.prompt[:-1], len(self.prompt) - 1, 0)
        if self.refining is not None:
            return Feed(self.refining, 0, self.block_size)
        room = max(0, self.max_new - len(self.out) - 1)  # a forward yields at most n_draft + 1 tokens
        # The masks only draft the next forward, and only when its lookup finds nothing. A lookup draft's
        # occurrence always continues past it (what follows the match, then its repeat: `_lookup`), so
        # if every draft token stands the next draft comes from lookup again: no masks beside it.
        masks = 0 if self.from_lookup else self.n_masks
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

    def _index_new_tokens(self) -> list[int]:
        """prompt + output, with the lookup index brought up to date: every g-gram that starts before
        the last one (the sequence's own tail is no match) maps to its latest start. Only the tokens
        committed since the last call are indexed: O(new tokens) per forward, not O(length)."""
        seq, before = self._seq, self._indexed
        seq += self.out[len(seq) - len(self.prompt) :]
        for g, index in self._index.items():
            # starts 0 … len − g − 1 are indexed; those up to before − g − 1 were already
            for s in range(max(0, before - g), len(seq) - g):
                index[tuple(seq[s : s + g])] = s  # a later start overwrites: the latest occurrence
        self._indexed = len(seq)
        return seq

    def _lookup(self) -> list[int]:
        """Prompt lookup: the tokens (at most `lookup_max`) that followed the latest earlier occurrence of
        the last 3 (else 2) tokens of prompt + output; [] when there is none. What follows the match up
        to the end of the sequence is continued as a repeat (a loop of 5 tokens drafts the loop again),
        so the continuation never ends and the draft is `lookup_max` tokens long."""
        seq = self._index_new_tokens()
        for g in self.LOOKUP_NGRAMS:
            if len(seq) <= g:
                continue
            s = self._index[g].get(tuple(seq[-g:]))
            if s is not None:
                return lookup.continuation(seq, s, g, self.lookup_max)
        return []

    def _next_draft(self, masks_draft: list[int]) -> None:
        """The next draft: prompt lookup's continuation when lookup is on and finds one, else the masks'.
        With adaptive drafting a lookup draft is only as long as pays on lookup's own record so far
        (`best_lookup_length`): a 16-token forward costs several 1-token ones on a CPU."""
        found = self._lookup() if self.lookup else []
        if found and self.cost is not None and self.ADAPTIVE_LOOKUP:
            kept, refused = self.kept_by["lookup"], self.refused_by["lookup"]
            found = found[: best_lookup_length((kept + 1) / (kept + refused + 2), self.cost, len(found))]
        self.draft, self.from_lookup = (found, True) if found else (masks_draft, False)

    def _record(self, kept: int, refused: bool) -> None:
        """One verifying forward's outcome, in the record of the source of its draft (none: no draft)."""
        source = "lookup" if self.from_lookup else "masks"
        self.kept_by[source] += kept
        self.refused_by[source] += bool(refused)
        self.rejections += bool(refused)

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
        self._head_chain = 0
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
            top = torch.log_softmax(masks[1 : 1 + depth].float(), dim=-1).topk(width, dim=-1)
            parts += [top.indices.double().flatten(), top.values.double().flatten()]
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
        m = max(0, n_masks - 1)
        chain = self._read_chain(values[n:])
        at = n + (self._head_chain or m)
        cand = [[int(v) for v in values[at + d * width : at + (d + 1) * width]] for d in range(depth)]
        at += depth * width
        cand_lp = [[-math.inf if t == self.mask_id else v  # the mask token is no candidate (a tiny vocabulary)
                    for t, v in zip(cand[d], values[at + d * width : at + (d + 1) * width])] for d in range(depth)]
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
            self.branches = trees.beam_paths(self.tree, cand, cand_lp) + ([chain] if self.from_lookup else [])
        else:  # the masks followed a refused branch: the main chain's places after the kept path remain
            self._next_draft(self._leftover(a, new[-1], was_lookup))
            self.branches = []
        return trees.compaction(path)

    def _leftover(self, kept: int, next_token: int, was_lookup: bool) -> list[int]:
        """The next draft after a refusal when lookup finds none: the refused masks' draft's later places
        (`leftover_draft`; greedy only), no longer than the draft the row would feed now (adaptive
        drafting) or a block. A refused lookup draft leaves nothing: lookup itself looks again."""
        if not self.REUSE_LEFTOVER or was_lookup or self.temperature > 0:
            return []
        longest = self.block_size - 1 if self.cost is None else max(0, self.n_masks - 1)
        return leftover_draft(self.draft, kept, next_token)[:longest]

    def _adapt(self) -> None:
        """Adaptive drafting: the next forward's mask count from the acceptance so far (class docstring)."""
        if self.cost is not None and self.block_size > 1:  # the geometric acceptance estimate, with a prior
            kept, refused = self.kept_by["masks"], self.refused_by["masks"]  # the masks' own record
            alpha = (kept + 1) / (kept + refused + 2)
            d = best_draft_length(alpha, self.cost, self.block_size - 1, self.tree or ())
            self.plain_steps = self.plain_steps + 1 if d == 0 else 0
            if d == 0 and self.plain_steps % self.PROBE_EVERY == 0:
                d = 1  # a probe: masks now, a one-token draft verified in the next forward
            self.n_masks = d + 1 if d else 0
        elif self.fallback and self.temperature <= 0:
            kept, refused = self.kept_by["masks"], self.refused_by["masks"]
            failing = refused >= self.FALLBACK_AFTER and (kept + 1) / (kept + refused + 2) < self.FALLBACK_ALPHA
            self.plain_steps = self.plain_steps + 1 if failing else 0
            self.n_masks = 0 if failing and self.plain_steps % self.PROBE_EVERY else self.block_size

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
            if self.chain_probs is not None and not self.from_lookup:  # adaptive: as far as the drafter is sure
                sure = confident_length(self.chain_probs, self.cost, self.n_masks, self.REFUSAL_COST)
                self.draft = self.draft[:sure]
        return n - a


def make_row(method: str, prompt: list[int], *, mask_id: int | None, block_size: int = 16, gamma: float = 0.35,
             proxy: str = "entropy", draft: str = "block", fixed: int | None = None, anchor: bool = False,
             fallback: bool = False, cost=None, lookup: bool = False, lookup_max: int = VerifyRow.LOOKUP_MAX,
             tree=None, processing: Processing | None = None, **common) -> Row:
    """A row for `method` ("ntp", "sbd", "sbd-verify"); draft "block", "eb" or "adaptive" (with `cost`,
    width → relative forward time); anchor (sbd): plain SBD anchored on the next-token head
    (`sbd.decoding.anchored`); fallback (sbd-verify, draft "block", greedy): plain steps while the masks'
    drafts almost never stand (`VerifyRow.FALLBACK_ALPHA`); lookup (sbd-verify, greedy): drafts from
    prompt lookup when it finds a match, at most `lookup_max` tokens (`VerifyRow.LOOKUP_MAX`); tree
    (sbd-verify, greedy): tree drafts of these widths per depth (`VerifyRow`); processing: logit_bias, penalties, top_p and
    logprobs of the next-token head (ntp and sbd-verify; validate it with
    `processing.validate(vocab_size)` first); `common`: max_new, eos, stop, tokenizer, temperature,
    seed, device. Other arguments are validated by the caller (`generate`, the server)."""
    if processing is not None and not processing.is_default:
        if method not in ("ntp", "sbd-verify"):
            raise SBDError(f"logit_bias, penalties, top_p and logprobs apply to method='ntp' or 'sbd-verify' "
                           f"(the next-token head); method={method!r} reveals tokens with the masked head")
        common["processing"] = processing
    if tree is not None and method != "sbd-verify":
        raise SBDError(f"tree drafts apply to method='sbd-verify'; method={method!r} has no draft to branch")
    if method == "ntp":
        return NTPRow(prompt, **common)
    if method == "sbd-verify":
        return VerifyRow(prompt, block_size=block_size, mask_id=int(mask_id), proxy=proxy,
                         eb_gamma=float(gamma) if draft == "eb" else None,
                         cost=cost if draft == "adaptive" else None, lookup=lookup, lookup_max=lookup_max,
                         tree=tree, fallback=fallback, **common)
    if anchor:
        return AnchoredRow(prompt, block_size=block_size, mask_id=int(mask_id), gamma=float(gamma), **common)
    return SBDRow(prompt, block_size=block_size, mask_id=int(mask_id), gamma=float(gamma), proxy=proxy,
                  fixed=fixed, **common)
