"""SBDProposer: vLLM's `custom_class` speculative method for sbd-verify.

vLLM's (V1) runner calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=)`
once per step, after sampling and bookkeeping, in the worker process that ran the model; entry i of
every argument is request i of this step's batch. The draft returned for a request is

    prompt lookup's continuation (sbd's rule, the request's `LookupIndex`), when lookup is on and finds
    one, else [d_1..d_n, MASK x k]: d = the masks' chain of the previous step (masks 2..k; the first
    mask sits where the bonus token went), only if every draft token of that step stood, else no d.

vLLM verifies the draft with its own rejection sampler and always refuses the masks (their logit is -inf):
the outputs are vLLM's own. A lookup draft goes without masks, as in sbd (`VerifyRow.feed`).

Drafting (`sbd_draft`): "adaptive" (default) is sbd's `draft="adaptive"` per request: each request holds
the `DraftPolicy` and drafters every sbd-verify row holds (`_Req`). Widths are priced by this engine's own step times (`StepCost`, the class sbd's engine holds, kept
apart for forwards with masks and without); in a batch of B a request's extra width delays all B (1 +
B·(T(B − 1 + w)/T(B) − 1)). Then one decision for the whole step (`sbd.decoding.batch_drafts`): the least
valuable drafts go first while that pays, a plain step when nothing does. A lookup draft that does not pay
is a plain step here (`DraftPolicy.lookup_length`, skip_unpaid). Probes are batch-wide: after
`DraftOptions.probe_every` − 1 plain engine steps, one step lets every request put up a one-token probe.
vLLM's runner is read in `runner.py` only, the masks' chains in `chains.py`. "block": always k masks and
full lookup drafts (the fixed rule, for comparison and tests).

Settings (model config keys; `hf_overrides`): `sbd_masks` (the most masks; default the adapter's block size),
`sbd_lookup` / `sbd_lookup_max` (default the adapter's `decoding` record), `sbd_sampler_head`, `sbd_draft`,
`sbd_cost_slope` (a fixed 1 + slope·(w − 1), for tests). `num_speculative_tokens` caps every draft.

Counters (`stats.py`) go to `SBD_VLLM_STATS=path` as JSON after every step (the tests read them there).
"""

from __future__ import annotations

import os
import time

from sbd.decoding.batch_drafts import drafts_to_drop
from sbd.decoding.defaults import from_record
from sbd.decoding.draft_policy import DEFAULT_OPTIONS, LOOKUP_MAX, DraftOptions, DraftPolicy
from sbd.decoding.proposers.base import Seen
from sbd.decoding.proposers.chain import MaskChain
from sbd.decoding.proposers.head import HeadChain
from sbd.decoding.proposers.lookup import LookupIndex
from sbd.decoding.width_cost import StepCost

from . import stats
from .chains import mask_chains
from .runner import RunnerView, find_runner


class _Req:
    """A request: its drafting policy and drafters (those `VerifyRow` holds: the masks' chain or the sampler
    head's, prompt lookup's index over its tokens), its draft's source ("masks", "lookup", None), last step."""

    __slots__ = ("policy", "chain", "lookup", "source", "seen")

    def __init__(self, masks: int, options: DraftOptions, head: bool):
        self.policy = DraftPolicy(masks, options)
        self.chain = HeadChain() if head else MaskChain()
        self.lookup: LookupIndex | None = None  # made at the first lookup, over the tokens then
        self.source = None
        self.seen = 0


class SBDProposer:
    def __init__(self, vllm_config, options: DraftOptions | None = None):
        """vllm_config: what vLLM builds a `custom_class` proposer with; options: the drafting switches
        (`DraftOptions`; vLLM passes none: the defaults)."""
        self.options = options or DEFAULT_OPTIONS
        spec = vllm_config.speculative_config
        self.num_spec = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.cfg = vllm_config.model_config.hf_config
        self.model = self.runner = None
        self.stats = stats.fresh()
        self._stats_path = os.environ.get("SBD_VLLM_STATS")
        self._trace_path = os.environ.get("SBD_VLLM_TRACE")  # JSON lines: one per request and step (tests)
        self._reqs: dict[str, _Req] = {}
        self._last_t = None  # perf_counter at the start of the previous propose
        self._last_ids: set = set()
        self._step = 0
        self._plain_run = 0  # consecutive engine steps without any draft (batch-level probes)

    def load_model(self, model, *args, **kwargs) -> None:
        if not hasattr(model, "sbd_bind"):
            raise TypeError(f"SBDProposer needs one of sbd's model classes (SBDLlamaForCausalLM, ...), got "
                            f"{type(model).__name__}: select it with the config's architectures or hf_overrides")
        self.runner = RunnerView(find_runner(self))
        self.model = model
        model.sbd_bind(self.runner.batch_view)
        self.mask_id = model.sbd_mask_id
        adapter = model.sbd_adapter_config
        # the drafting settings the adapter records, read as sbd's own engine reads them (`from_record`); without
        # a record: lookup only when there are no masks, adaptive lengths (this engine measures its own costs)
        recorded = from_record(adapter.decoding, "the drafting adapter's adapter_config.json") \
            if adapter is not None and adapter.decoding else None
        block = adapter.block_size if adapter is not None else 0
        self.masks = min(int(getattr(self.cfg, "sbd_masks", block)), self.num_spec) if adapter is not None else 0
        lookup = recorded.lookup if recorded is not None else adapter is None
        lookup_max = recorded.lookup_max if recorded is not None else LOOKUP_MAX
        self.lookup_on = bool(getattr(self.cfg, "sbd_lookup", lookup))
        self.lookup_max = min(int(getattr(self.cfg, "sbd_lookup_max", lookup_max)), self.num_spec)
        self.head = model.sbd_head if getattr(self.cfg, "sbd_sampler_head", True) else None
        draft = recorded.draft if recorded is not None else "adaptive"
        self.adaptive = str(getattr(self.cfg, "sbd_draft", draft)) == "adaptive"
        slope = getattr(self.cfg, "sbd_cost_slope", None)
        self.fixed_slope = None if slope is None else float(slope)
        # step times measured online, apart for the two kinds of forward: plain ones (prefills, plain steps,
        # lookup drafts) and those with masks (the same graph, plus the gate's writes and the stash)
        self.cost_model = StepCost()
        self.gated_cost = StepCost(fallback=self.cost_model)
        # whether vLLM runs the model compiled (then every forward, with masks or without, is its graph)
        self.stats["compiled"] = not getattr(getattr(model, "model", None), "do_not_compile", True)

    # -- cost ---------------------------------------------------------------------------------------
    def _measure(self, now: float, req_ids, sampled_token_ids, gated: bool) -> None:
        """One engine step's time (since the previous propose) against its total scheduled width, in the
        record of its kind (`gated`: the forward had masks). Steps that took a new request in (a prefill,
        maybe after idle time) or a prompt chunk are not counted."""
        ids = set(req_ids)
        last, self._last_t = self._last_t, now
        prev_ids, self._last_ids = self._last_ids, ids
        if last is None or not ids or not ids <= prev_ids or any(not s for s in sampled_token_ids):
            return
        width = self.runner.total_width(len(req_ids))
        (self.gated_cost if gated else self.cost_model).add(width, now - last)

    def _cost(self, batch: int, masks: bool = False):
        """A request's cost function (`StepCost.for_batch`); `masks`: for a mask draft, whose widened step
        is a forward with masks."""
        if self.fixed_slope is not None:
            slope = self.fixed_slope
            return lambda w: 1.0 + slope * (w - 1)
        return self.cost_model.for_batch(batch, self.gated_cost if masks else None)

    # -- drafting -----------------------------------------------------------------------------------
    def _record(self, r: _Req, spec, sampled) -> None:
        """This step's outcome in the record of its draft's source (`DraftPolicy.record`)."""
        n = len(spec)
        while n and spec[n - 1] == self.mask_id:
            n -= 1
        if r.source is not None and n:
            kept = min(len(sampled) - 1, n)
            r.policy.record(r.source, kept, kept < n)

    def _lookup_draft(self, r: _Req, seq, room: int, cost, probe: bool) -> list[int]:
        if r.lookup is None or len(seq) < r.lookup.indexed:  # a request's tokens only grow, else start over
            r.lookup = LookupIndex(seq)
        found = r.lookup.propose([], Seen(out=seq[r.lookup.prompt_length :], longest=min(self.lookup_max, room)))
        if self.mask_id in found:  # a mask token copied from a prompt: never a draft token
            found = found[: found.index(self.mask_id)]
        # a lookup draft that does not pay even at its best length is a plain step here (sbd's rows
        # always draft >= 1 to keep lookup's record growing: here only as a probe)
        return found[: r.policy.lookup_length(len(found), cost, skip_unpaid=True, probe=probe)]

    def _decide(self, drafts, req_ids, batch: int) -> None:
        """One decision for the whole step (`sbd.decoding.batch_drafts`): the drafts as chosen, or fewer, or
        none. The step's time is T(total width)/T(batch) (`StepCost`, read from the forwards with masks once
        a mask draft is in the step; with `sbd_cost_slope` 1 + slope·(W − B))."""
        if self.fixed_slope is not None:
            slope = self.fixed_slope

            def ratio(w, gated):
                return 1.0 + slope * (w - batch)
        else:
            base = self.cost_model.time(batch)

            def ratio(w, gated):
                return (self.gated_cost if gated else self.cost_model).time(w) / base
        policies = [self._reqs[r].policy if d else None for r, d in zip(req_ids, drafts)]
        for i in drafts_to_drop(drafts, policies, self.mask_id, batch, ratio):
            drafts[i] = []
            self._reqs[req_ids[i]].source = None

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs):
        now = time.perf_counter()
        nreq = len(sampled_token_ids)
        req_ids = self.runner.req_ids(nreq)
        specs = self.runner.spec_token_ids()
        stash = self.model.sbd_take_stash()  # None: this step's forward had no masks
        self._measure(now, req_ids, sampled_token_ids, stash is not None)
        self._step += 1
        active = sum(1 for s in sampled_token_ids if s)
        cost = self._cost(max(1, active)) if self.adaptive else None
        mask_cost = self._cost(max(1, active), masks=True) if self.adaptive else None
        # the plain step's time at this batch size is what every draft is priced against: until it is
        # measured (no prior knows the jump from a 1-token to a 2-token step), this step goes plain
        # (a width near it measured is read from there: `StepCost.near`, `time` interpolates by width)
        explore = self.adaptive and self.fixed_slope is None and active and not self.cost_model.near(active)
        # probes are batch-wide: one step in `probe_every` after a run of plain steps lets every request whose
        # record says no draft pays put up a one-token probe (and is not trimmed by the batch decision)
        probe = self.adaptive and self._plain_run >= self.options.probe_every - 1
        drafts: list[list[int]] = [[] for _ in range(nreq)]
        wants_chain: dict[int, int] = {}
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a prompt chunk, or a discarded request: no draft
                continue
            self.stats["steps"] += 1  # per request and step (= steps at batch 1)
            self.stats["tokens"] += len(sampled)
            r = self._reqs.get(req_ids[i])
            if r is None:
                r = self._reqs[req_ids[i]] = _Req(self.masks, self.options, self.head is not None)
            r.seen = self._step
            if self.adaptive:
                self._record(r, specs[i], sampled)
                r.policy.adapt(mask_cost, probe)  # the next mask draft's mask count, probes batch-wide
            r.source = None
            if explore:
                continue
            n = int(num_tokens_no_spec[i])
            room = min(self.num_spec, self.max_model_len - n - 1)
            if room <= 0:
                continue
            draft = []
            if self.lookup_on:
                draft = self._lookup_draft(r, token_ids_cpu[i, :n].tolist(), room, cost, probe)
                if draft:
                    r.source = "lookup"
            if not draft and min(r.policy.n_masks, room):
                wants_chain[i] = min(r.policy.n_masks, room)
            drafts[i] = draft
        if wants_chain:
            chains, again = mask_chains(self.model, self.head, stash, {i: self._reqs[req_ids[i]].chain for i in wants_chain},
                                        sampled_token_ids, self.runner.req_ids(),
                                        self.adaptive and self.options.cuts_chains(False)) \
                if stash is not None else ({}, False)
            self.stats["logits_fallback"] += again
            self.stats["head_chains"] += len(chains) if self.head is not None else 0
            for i, k in wants_chain.items():
                chain, probs = chains.get(i, ([], None))
                chain = chain[: min(self.num_spec, self.max_model_len - int(num_tokens_no_spec[i]) - 1) - k]
                if probs is not None and mask_cost is not None:  # adaptive: as far as the drafter is sure
                    chain = chain[: self._reqs[req_ids[i]].policy.confident(probs[: len(chain)], mask_cost, k)]
                drafts[i] = chain + [self.mask_id] * k
                self._reqs[req_ids[i]].source = "masks"
        if self.adaptive and not probe and any(drafts):
            self._decide(drafts, req_ids, active)
        self._plain_run = 0 if any(drafts) else self._plain_run + 1
        stats.count_drafts(self.stats, drafts, sampled_token_ids, self.mask_id)
        if self._trace_path:
            for i, sampled in enumerate(sampled_token_ids):
                if sampled:
                    stats.trace(self._trace_path, req_ids[i], sampled,
                                token_ids_cpu[i, : int(num_tokens_no_spec[i])], drafts[i])
        self.stats["forwards"] = self.model.sbd_forwards
        self.stats["eager_forwards"] = self.model.sbd_eager_forwards()
        if len(self._reqs) > 4 * max(8, nreq):  # forget finished requests
            self._reqs = {k: v for k, v in self._reqs.items() if v.seen >= self._step - 1}
        if self._stats_path:
            stats.write(self._stats_path, self.stats)
        return drafts
