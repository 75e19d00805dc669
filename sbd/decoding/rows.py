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

from ..sampler import entropy_and_argmax, error_proxy, pick_tokens
from . import trees
from .draft_policy import DraftPolicy
from .forward import Feed
from .processing import pick, target_probs, token_logprobs
from .proposers.base import Seen
from .proposers.chain import MaskChain, leftover_draft
from .proposers.eb import EBReveal, eb_rule
from .proposers.head import HeadChain
from .proposers.lookup import LookupIndex
from .row import Row


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
    """sbd-verify (module docstring): verify a draft, commit what stands, and ask the drafters for the next.

    Its drafters (`sbd.decoding.proposers`, one interface): the masks' chain (`MaskChain`, their argmax),
    the sampler head's (`HeadChain`, their candidates re-ranked, when the engine hands `ask` a `Drafting`:
    greedy block or adaptive drafts, `drafts_with_head`), prompt lookup (`LookupIndex`, greedy: its continuation
    when it finds one, and then no masks beside it) and the EB rule's reveal (`EBReveal`, draft "eb":
    the next draft revealed over forwards of its own, greedy). Tree drafts are `sbd.decoding.tree_rows`.
    How long a draft is, and from which source, is the row's `DraftPolicy` (the policy the vLLM proposer
    holds per request): cost (draft "adaptive"), width → relative step time (`sbd.decoding.width_cost`),
    else whole blocks. Greedy, the longest draft prefix NTP would produce is kept with NTP's next token;
    sampling, speculative acceptance (`accept_sampled`) against the masks' own distribution q (never the
    head's). Either way the tokens are NTP's."""

    def __init__(self, spec, prompt, *, mask_id: int, cost=None, **kw):
        super().__init__(spec, prompt, **kw)
        # which settings go together was decided where the spec was resolved (`sbd.decoding.spec`)
        self.options, self.tree = spec.draft_options, trees.check_shape(spec.tree)
        self.block_size, self.mask_id = spec.block_size, int(mask_id)
        self.cost = cost if spec.draft == "adaptive" else None
        self.mask_cost = getattr(self.cost, "masks", self.cost)  # a step that feeds masks (`StepCost.masks`)
        # fallback: whole-block greedy drafts only (`DraftPolicy.fall_back`)
        self.policy = DraftPolicy(self.block_size, self.options, tree=self.tree or (), fallback=spec.fallback and
                                  self.cost is None and spec.eb_gamma is None and self.temperature <= 0)
        if self.cost is not None and self.options.price_first_draft:
            self.policy.adapt(self.mask_cost)  # the first draft's masks, from the record's prior
        self.lookup_max = spec.lookup_max  # the longest lookup draft
        self.lookup_index = LookupIndex(self.prompt) if spec.lookup else None
        self.chains = MaskChain(), HeadChain()  # the masks' argmax, the sampler head's
        self.chain = self.chains[0]  # the one asked last
        self.eb = EBReveal(self.block_size, spec.eb_gamma, spec.proxy, mask_id) if spec.eb_gamma is not None else None
        self.needs_extra = verify_width(self.block_size, self.lookup_max if spec.lookup else 0, self.tree)
        self.from_lookup = False  # the current draft came from prompt lookup
        self.in_prefill = len(self.prompt) > 1
        self.head = self.prompt[-1]
        self.draft: list[int] = []
        self.q_draft: torch.Tensor | None = None  # sampling: the masked distribution of the draft
        self.q_next = None

    @property
    def drafts_with_head(self) -> bool:
        """Whether this row drafts with a sampler head when the model has one: greedy block/adaptive drafts."""
        return self.temperature <= 0 and self.eb is None

    @property
    def rejections(self) -> int:
        """Verifying forwards in which a draft token was refused."""
        return self.policy.rejections

    def _room(self) -> int:
        return max(0, self.max_new - len(self.out) - 1)  # a forward yields at most n_draft + 1 tokens

    def _masks(self) -> int:
        # The masks only draft the next forward, and only when its lookup finds nothing. A lookup draft's
        # occurrence always continues past it (what follows the match, then its repeat: `LookupIndex`), so
        # if every draft token stands the next draft comes from lookup again: no masks beside it.
        return 0 if self.from_lookup else self.policy.n_masks

    def feed(self) -> Feed:
        if self.in_prefill:
            return Feed(self.prompt[:-1], len(self.prompt) - 1, 0)
        if self.eb is not None and self.eb.active:
            return self.eb.feed()
        room, masks = self._room(), self._masks()
        if len(self.draft) > room:
            self.draft = self.draft[:room]
            self.q_draft = self.q_draft[:room] if self.q_draft is not None else None
        n = len(self.draft)
        return Feed([self.head] + self.draft + [self.mask_id] * masks, 1 + n, 1 + n + masks)

    def ask(self, logits: torch.Tensor, drafting=None) -> torch.Tensor:
        """drafting: a `sbd.decoding.proposers.head.Drafting` (the engine passes one when the model has an
        enabled sampler head and `drafts_with_head`): the next draft's chain comes from the head."""
        if self.eb is not None and self.eb.active:
            return torch.cat(self.eb.values(Seen(logits)))
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
            if self.eb is not None:  # the first reveal step of the next draft, over all the masks
                parts += self.eb.values(Seen(masks))
            else:  # adaptive chains are cut where the drafter is unsure: its probabilities are sent along
                self.chain = self.chains[drafting is not None]
                self.chain.cut = self.cost is not None and self.options.cuts_chains(drafting is not None)
                parts += self.chain.values(Seen(masks[1:], 2 + n, tokens[-1], drafting))
        if self.logprobs is not None:  # for every position: the token kept there, if it is kept
            parts.append(token_logprobs(ntp, tokens, self.top_logprobs).flatten())
        return torch.cat(parts)

    def answer(self, values: list[float]) -> int | list[int]:
        if self.in_prefill:
            self.in_prefill = False
            self._next_draft([])
            return 0
        self.nfe += 1
        if self.eb is not None and self.eb.active:
            self.draft = self.eb.propose(values)
            return 0
        n = len(self.draft)
        lp = (n + 1) * self._logprob_width()
        values, lp_values = (values[:-lp], values[-lp:]) if lp else (values, [])
        if self.temperature > 0:
            a, tokens, rest = int(values[0]), [int(v) for v in values[1 : n + 2]], values[n + 2 :]
        else:
            tokens, a = [int(v) for v in values[: n + 1]], 0
            while a < n and self.draft[a] == tokens[a]:
                a += 1
            rest = values[n + 1 :]
        self.lookup_accepted += a if self.from_lookup else 0
        self._verified(a, n, a < n)
        new = tokens[: a + 1]  # draft tokens kept (they equal NTP's) + NTP's next token
        start = self._take(new, lp_values)
        end = self._end(start, new)
        if end is not None:
            self._finish(end)
            return n - a
        self.head, self.q_draft = new[-1], None
        was_lookup, self.from_lookup = self.from_lookup, False
        if a < n:  # the masks rode on a rejected draft: the rest of that draft is the next guess
            self._next_draft(self._leftover(a, new[-1], was_lookup))
        elif self.temperature > 0:
            self.draft, self.q_draft = [int(v) for v in rest], self.q_next
        elif self.eb is not None:
            self.eb.start(self.head)
            self.draft = self.eb.propose(rest)
        else:  # the masks' chain (the sampler head's, when it drew it)
            self._next_draft(self.chain.propose(rest))
            if self.chain.probs is not None and not self.from_lookup:  # adaptive: as far as the drafter is sure
                self.draft = self.draft[: self.policy.confident(self.chain.probs, self.mask_cost, self.policy.n_masks)]
        return n - a

    def _verified(self, kept: int, proposed: int, refused: bool) -> None:
        """One verifying forward's outcome in the row's counts and its policy's record of the draft's
        source; then the next forward's mask count (`DraftPolicy.adapt`)."""
        self.accepted.append(kept)
        self.proposed += proposed
        self.policy.record("lookup" if self.from_lookup else "masks", kept, refused)
        self.policy.adapt(self.mask_cost)

    def _next_draft(self, masks_draft: list[int]) -> None:
        """The next draft: prompt lookup's continuation when lookup is on and finds one, as long as the
        policy says pays (`DraftPolicy.lookup_length`), else the masks'."""
        found = [] if self.lookup_index is None else self.lookup_index.propose([], Seen(out=self.out, longest=self.lookup_max))
        found = found[: self.policy.lookup_length(len(found), self.cost)]
        self.draft, self.from_lookup = (found, True) if found else (masks_draft, False)

    def _leftover(self, kept: int, next_token: int, was_lookup: bool) -> list[int]:
        """The next draft after a refusal when lookup finds none: the refused masks' draft's later places
        (`leftover_draft`, with `DraftOptions.reuse_leftover`; greedy only), no longer than the draft the
        row would feed now (adaptive drafting) or a block. A refused lookup draft leaves nothing: lookup
        itself looks again."""
        if not self.options.reuse_leftover or was_lookup or self.temperature > 0:
            return []
        longest = self.block_size - 1 if self.cost is None else max(0, self.policy.n_masks - 1)
        return leftover_draft(self.draft, kept, next_token)[:longest]
