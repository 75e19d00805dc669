"""How long to draft, and from which source: one policy object per row (sbd-verify) or per request (the
vLLM proposer), so that both engines follow the same rule and cannot drift apart.

`DraftPolicy` keeps the record of what each draft source (the masks, prompt lookup) had kept and refused,
and from it picks the next mask count (`best_draft_length`, with a one-token probe every `probe_every`
plain steps), the length of a lookup draft (`best_lookup_length`), where a chain is cut by the drafter's
confidence (`confident_length`) and, for masks never trained for drafting, when to step aside to plain
next-token steps. `DraftOptions` holds the switches that experiments turn (frozen: given, not patched).
The pure numeric rules sit beside it in `draft_lengths`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .draft_lengths import best_draft_length, best_lookup_length, confident_length, expected_tokens

# The longest prompt-lookup draft by default. A lookup draft runs as long as its earlier occurrence does and
# is fed without masks, so it costs its own width only: 16 makes a lookup forward (1 + 16) no wider than a
# verifying forward of the default block of 16 (2·16 + 1), so the default engine width and cache room stay
# as they were (Hugging Face's prompt lookup drafts 10).
LOOKUP_MAX = 16
SOURCES = ("masks", "lookup")


@dataclass(frozen=True)
class DraftOptions:
    """The drafting switches, with the defaults measured best (docs/method.md, docs/performance.md).

    reuse_leftover (greedy): after a refusal, the refused draft's later places are the next draft
    (`leftover_draft`). Off: measured worse on both models (the masks then ride on a draft that is often
    refused again, instead of drafting afresh in the right context): demo block 8 3.68 vs 3.90 tokens per
    forward, SmolLM2 chain 1.26 vs 1.41, tree 3,2 1.31 vs 1.58 (docs/results_smollm2.md).

    refusal_cost (adaptive drafting, chains of the masks): the next draft is cut where the drafter is
    unsure (`confident_length`); this many tokens is what a refused draft costs beyond itself. None: not
    cut. Measured: docs/performance.md, "Drafts cut by the drafter's confidence".

    cut_head_chains: also cut the chains a sampler head draws (by its probability of each pick). Off:
    measured no faster on SmolLM2 with its adapter (time 1.01x and 1.05x of not cut, interleaved).

    adaptive_lookup (adaptive drafting): a lookup draft only as long as pays on lookup's own record
    (`best_lookup_length`); False drafts all of it whenever lookup finds one.

    probe_every: while no draft pays (or the fallback holds), a probe every this many plain steps notices
    drafts that start to pay again. 48, not 16: a probe costs ~1.9 plain steps on quantized weights, and on
    SmolLM2 every 48 ran 1.02–1.07x every 16 (int4 and float32, chat and gsm prompts; 128 as fast as 48;
    docs/performance.md §9, "Probes").

    price_first_draft (adaptive drafting): a row's first draft feeds as many masks as pay on the record's
    prior (a token stands with chance 1/2), as every later one does and as the vLLM proposer does. Off unless
    the model's decoding defaults record `"first_draft": "priced"` (SmolLM2's drafter does: +5–6%, int4 and
    float32); without it a row opens with a whole block of masks, since the demo model's short answers,
    priced, opened with plain steps and seldom drafted at all (2x the forwards); docs/performance.md §9.

    fallback_after, fallback_alpha (whole-block drafts of masks never trained for drafting): after this
    many refused drafts, plain next-token steps while a draft token's estimated chance to stand stays
    under fallback_alpha (a whole-block draft forward then yields < 1.18 tokens, less than its width costs
    anywhere), with a whole-block probe every probe_every forwards."""

    reuse_leftover: bool = False
    cut_head_chains: bool = False
    adaptive_lookup: bool = True
    refusal_cost: float | None = 0.5
    probe_every: int = 48
    price_first_draft: bool = False
    fallback_after: int = 8
    fallback_alpha: float = 0.15

    def cuts_chains(self, head: bool) -> bool:
        """Whether adaptive chains are cut by the drafter's confidence: the masks' (`head` False) or a
        sampler head's."""
        return self.refusal_cost is not None and (not head or self.cut_head_chains)


DEFAULT_OPTIONS = DraftOptions()


class DraftPolicy:
    """One row's or request's drafting record and the draft lengths it implies.

    masks: the most masks a draft may feed (a row's block size, the proposer's `sbd_masks`); tree: widths
    per depth whose branches widen the forward (priced by `best_draft_length`); fallback: step aside to
    plain steps while whole-block drafts fail (`fall_back`). `n_masks` is the mask count the next mask
    draft feeds; `plain_steps` the run of plain steps since a draft last paid."""

    def __init__(self, masks: int, options: DraftOptions | None = None, *, tree: Sequence[int] = (),
                 fallback: bool = False):
        self.options = options or DEFAULT_OPTIONS
        self.masks, self.tree, self.fallback = masks, tuple(tree or ()), fallback
        self.kept = dict.fromkeys(SOURCES, 0)  # draft tokens kept, per source
        self.refused = dict.fromkeys(SOURCES, 0)  # forwards in which a draft token was refused, per source
        self.rejections = 0  # forwards with a refused draft token, all sources
        self.n_masks = masks
        self.plain_steps = 0
        self.lookup_skips = 0  # lookup drafts not put up because none paid (`lookup_length`, skip_unpaid)

    def alpha(self, source: str) -> float:
        """The chance a draft token of `source` stands once the one before it stood: its record, with a
        uniform prior (a geometric acceptance estimate)."""
        kept, refused = self.kept[source], self.refused[source]
        return (kept + 1) / (kept + refused + 2)

    def record(self, source: str, kept: int, refused: bool) -> None:
        """One verifying forward's outcome, in the record of its draft's source."""
        self.kept[source] += kept
        self.refused[source] += bool(refused)
        self.rejections += bool(refused)

    def adapt(self, cost, probe: bool | None = None) -> None:
        """The next mask draft's mask count (`n_masks`) from the masks' record. cost: width → relative
        forward time (None: drafts are not adaptive; whole blocks, or the fallback). probe: whether a
        request whose record says no draft pays puts up a one-token probe now (the vLLM proposer decides
        that for its whole batch); None: every `probe_every` plain steps of this record."""
        if cost is None or self.masks <= 1:
            if self.fallback:
                self.fall_back()
            return
        if getattr(cost, "plain", False):  # the step cost asks for a one-token step to measure (`width_cost`)
            self.n_masks = 0
            return
        # a refusal's restart is charged where the row's forward is its own (`best_draft_length`)
        d = best_draft_length(self.alpha("masks"), cost, self.masks - 1, self.tree,
                              restart=getattr(cost, "rows", 1) <= 1)
        self.plain_steps = self.plain_steps + 1 if d == 0 else 0
        if d == 0 and (self.plain_steps % self.options.probe_every == 0 if probe is None else probe):
            d = 1  # a probe: masks now, a one-token draft verified in the next forward
        self.n_masks = d + 1 if d else 0

    def fall_back(self) -> None:
        """Whole-block drafts of untrained masks: none while they keep failing (`DraftOptions`), with a
        whole-block probe every `probe_every` plain steps."""
        o = self.options
        failing = self.refused["masks"] >= o.fallback_after and self.alpha("masks") < o.fallback_alpha
        self.plain_steps = self.plain_steps + 1 if failing else 0
        self.n_masks = 0 if failing and self.plain_steps % o.probe_every else self.masks

    def lookup_length(self, found: int, cost, *, skip_unpaid: bool = False, probe: bool = False) -> int:
        """How many of a lookup continuation's `found` tokens to put up, from lookup's own record: all of
        them unless drafts are adaptive (`cost`) and `adaptive_lookup`, else the length that pays best
        (at least one, so that lookup's record keeps growing). skip_unpaid (the vLLM proposer): 0 when
        even that length does not pay, unless `probe` (then one token)."""
        if not found or cost is None or not self.options.adaptive_lookup:
            return found
        if getattr(cost, "plain", False):  # a one-token step asked for (`adapt`)
            return 0
        alpha = self.alpha("lookup")
        d = best_lookup_length(alpha, cost, found)
        if skip_unpaid and expected_tokens(alpha, d) / cost(d + 1) < 1.0 / cost(1) - 1e-12:
            self.lookup_skips += 1
            return 1 if probe else 0
        return d

    def confident(self, probs: Sequence[float], cost, masks: int) -> int:
        """How much of a chain to put up, by the drafter's confidence in each token (`confident_length`)."""
        return confident_length(probs, cost, masks, self.options.refusal_cost)
