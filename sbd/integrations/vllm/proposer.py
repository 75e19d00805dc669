"""SBDProposer: vLLM's `custom_class` speculative method for sbd-verify.

vLLM's (V1) runner calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=)`
once per step, after sampling and bookkeeping, in the worker process that ran the model; entry i of
every argument is request i of this step's batch. The draft returned for a request is

    prompt lookup's continuation (sbd's rule, `sbd.decoding.lookup.draft`), when lookup is on and finds
    one, else [d_1..d_n, MASK x k]: d = the masks' chain of the previous step (masks 2..k; the first
    mask sits where the bonus token went), only if every draft token of that step stood, else no d.

vLLM schedules the draft as speculative tokens, verifies them with its own rejection sampler and always
refuses the masks (their logit is -inf), so the outputs are vLLM's outputs without speculation. A lookup
draft goes without masks, as in sbd (`VerifyRow.feed`): if it all stands, lookup drafts again.

Drafting (`sbd_draft`): "adaptive" (default) is sbd's `draft="adaptive"` per request: each request
holds a `DraftPolicy` (`sbd.decoding.draft_policy`), the object every sbd-verify row holds: the number
of masks from the masks' acceptance record (`best_draft_length`), a lookup draft only as long as pays on
lookup's record (`best_lookup_length`), a chain of the masks' argmax cut where they are unsure
(`confident_length`; a sampler head's chains are not cut, `DraftOptions.cut_head_chains`). The cost those
rules price widths with is this engine's, measured online (`StepCost`, the one sbd's engine holds), apart for forwards with masks
and without (the same compiled graph, but the stash and the gate's bookkeeping are theirs alone). In a batch of B requests a
request's extra width delays all B, so its cost is 1 + B·(T(B − 1 + w)/T(B) − 1) (T: step time at a
total width): drafting then pays only when the tokens it adds beat that, and when no draft pays for
any request the proposer returns no drafts, so vLLM runs the step as it would without speculation.
Then one decision for the whole step (`_decide`): the step's expected tokens per unit of measured time
(T(total width)/T(B)) against a plain step's B tokens, dropping the least valuable drafts first while that
pays; a plain step when nothing does. Where sbd's rows always draft at least one lookup token, a lookup
draft that does not pay is a plain step here (`DraftPolicy.lookup_length`, skip_unpaid). Probes are
batch-wide: after `DraftOptions.probe_every` − 1 plain engine steps, one step lets every request put up
a one-token probe (undecided), so at most one probe step in 16.
"block": always k masks (`sbd_masks`) and full lookup drafts (the fixed rule, for comparison/tests).

Settings (model config keys, `hf_overrides` can set them): `sbd_masks` (k, the most masks; default the
adapter's block size), `sbd_lookup` / `sbd_lookup_max` (default the adapter's `decoding` record),
`sbd_sampler_head`, `sbd_draft`, `sbd_cost_slope` (a fixed cost 1 + slope·(w − 1) per request instead
of the measured one: for tests). `num_speculative_tokens` caps every draft (masks included).

Counters (`stats`): engine steps that sampled, tokens they yielded, where the drafts came from,
whether vLLM runs the model compiled (`compiled`), the model's forwards (`forwards`) and how many of them
ran eagerly (`eager_forwards`: none when compiled);
with `SBD_VLLM_STATS=path` they are written there as JSON after every step (the worker is another
process; this is how the tests read tokens per forward).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from sbd.decoding.defaults import from_record
from sbd.decoding.draft_lengths import expected_tokens
from sbd.decoding.draft_policy import DEFAULT_OPTIONS, LOOKUP_MAX, DraftOptions, DraftPolicy
from sbd.decoding.proposers import chain as mask_chain
from sbd.decoding.proposers import lookup as sbd_lookup
from sbd.decoding.width_cost import StepCost


def lookup(seq, lookup_max: int) -> list[int]:
    """Prompt lookup as sbd does it: `sbd.decoding.proposers.lookup.draft` (the scan; sbd's rows keep
    its index, `LookupIndex`, which drafts the same tokens)."""
    return sbd_lookup.draft(seq, lookup_max)


def _find_runner(proposer, depth: int = 8):
    """The model runner that owns `proposer`: the caller of `load_model`.

    vLLM 0.32 gives a `custom_class` proposer no handle on its runner: the class is built with the
    `VllmConfig` alone (`create_custom_proposer`), `load_model` gets the model alone, and `propose` gets
    `sampled_token_ids`, the batch's `num_tokens_no_spec` and `token_ids_cpu` arrays and `slot_mappings`,
    never the request ids, the drafts scheduled or `query_start_loc` (the built-in proposers that need
    them, EAGLE and the GPU n-gram one, are handed the runner itself). The forward context holds neither.
    So the runner is the frame that called `load_model` with this proposer as its `drafter`, found once."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if getattr(owner, "drafter", None) is proposer and hasattr(owner, "input_batch"):
            return owner
        frame = frame.f_back
    raise RuntimeError("SBDProposer.load_model was not called by a vLLM model runner that holds it as its drafter")


class _Req:
    """A request: its drafting policy (the one `VerifyRow` holds), where this step's draft came from
    ("masks", "lookup", None) and the last step that saw it."""

    __slots__ = ("policy", "source", "seen")

    def __init__(self, masks: int, options: DraftOptions):
        self.policy = DraftPolicy(masks, options)
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
        self.stats = {"steps": 0, "tokens": 0, "lookup_drafts": 0, "mask_drafts": 0, "chain_tokens": 0,
                      "empty_drafts": 0, "plain_engine_steps": 0, "engine_steps": 0, "logits_fallback": 0,
                      "head_chains": 0}
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
        self.runner = _find_runner(self)
        self.model = model
        model.sbd_bind(self._batch_view)
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

    def _batch_view(self):
        batch = self.runner.input_batch
        n = batch.num_reqs
        qsl = self.runner.query_start_loc.np[: n + 1]
        ids = getattr(self.runner.input_ids, "cpu", None)  # vLLM's host copy of the forward's input ids
        return batch.req_ids[:n], batch.spec_token_ids[:n], qsl, None if ids is None else ids[: int(qsl[-1])]

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
        width = int(self.runner.query_start_loc.np[len(req_ids)])
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
        found = lookup(seq, min(self.lookup_max, room))
        if self.mask_id in found:  # a mask token copied from a prompt: never a draft token
            found = found[: found.index(self.mask_id)]
        # a lookup draft that does not pay even at its best length is a plain step here (sbd's rows
        # always draft >= 1 to keep lookup's record growing: here only as a probe)
        return found[: r.policy.lookup_length(len(found), cost, skip_unpaid=True, probe=probe)]

    @torch.inference_mode()
    def _chains(self, stash, want: dict[int, int], sampled) -> dict[int, tuple[list[int], list[float] | None]]:
        """Per batch index in `want` (index -> masks of the next draft): the masks' chain for the next
        step (masks 2..k of this step) and, without a sampler head, each token's drafting probability."""
        req_ids = self.runner.input_batch.req_ids
        keep = []
        for i, req_id, n_draft, at, m in stash.segments:  # at: first chain row (masks 2..m) in the stash
            if m >= 2 and i in want and req_ids[i] == req_id and len(sampled[i]) == n_draft + 1:
                keep.append((i, at, m - 1))
        if not keep:
            return {}
        rows = torch.cat([torch.arange(at, at + c) for _, at, c in keep]) if len(keep) > 1 else \
            torch.arange(keep[0][1], keep[0][1] + keep[0][2])
        hidden = stash.hidden.index_select(0, rows)
        if stash.logits is not None:
            logits = stash.logits.index_select(0, rows).float()
        else:  # compute_logits did not see this forward's rows (should not happen): project again
            self.stats["logits_fallback"] += 1
            logits = self.model.sbd_mask_logits(hidden)
        chains, at = {}, 0
        if self.head is None:
            best, probs = mask_chain.masks_top(logits, self.adaptive and self.options.cuts_chains(False))
            best, probs = best.tolist(), probs.tolist() if probs is not None else None
            for i, _, c in keep:
                chains[i] = (best[at : at + c], probs[at : at + c] if probs is not None else None)
                at += c
            return chains
        from sbd.drafters.sampler_head import draft_table, walk

        tables = self.model.sbd_tables()
        for i, _, c in keep:
            first = torch.tensor(sampled[i][-1])
            values = draft_table(self.head, tables, hidden[at : at + c].float(), logits[at : at + c], first)
            chains[i] = (walk(values.tolist(), c), None)
            at += c
        self.stats["head_chains"] += len(keep)
        return chains

    def _decide(self, drafts, req_ids, sampled_token_ids, batch: int) -> None:
        """One decision for the whole step: the drafts as chosen per request, or fewer, or none (a plain
        step), whichever yields the most expected tokens per unit of step time. A request's draft is
        priced as sbd's rules price it: a mask draft of k masks as its steady state (k − 1 chain tokens
        standing at the masks' record, 2k wide), a lookup draft of d tokens at lookup's record, 1 + d wide.
        The step's time is T(total width)/T(batch) (`StepCost`; with `sbd_cost_slope` 1 + slope·(W − B)),
        T read from the forwards with masks once a mask draft is in the step.
        Drafts are dropped least valuable (extra tokens per extra width) first; the best prefix wins."""
        if self.fixed_slope is not None:
            slope = self.fixed_slope

            def ratio(w, gated=False):
                return 1.0 + slope * (w - batch)
        else:
            base = self.cost_model.time(batch)

            def ratio(w, gated=False):
                return (self.gated_cost if gated else self.cost_model).time(w) / base
        gains = []  # (extra tokens, extra width, index)
        for i, d in enumerate(drafts):
            if not d:
                continue
            policy = self._reqs[req_ids[i]].policy
            if d[-1] == self.mask_id:
                k = len(d) - d.index(self.mask_id)
                tokens, width = expected_tokens(policy.alpha("masks"), k - 1), 2 * k
            else:
                tokens, width = expected_tokens(policy.alpha("lookup"), len(d)), 1 + len(d)
            gains.append((tokens - 1.0, max(1, width - 1), i, d[-1] == self.mask_id))
        gains.sort(key=lambda g: g[0] / g[1], reverse=True)
        best, best_n = batch / ratio(batch), 0
        tokens, width, gated = float(batch), batch, False
        for n, (t, w, _, masks) in enumerate(gains, 1):
            tokens, width, gated = tokens + t, width + w, gated or masks
            v = tokens / ratio(width, gated)
            if v > best + 1e-12:
                best, best_n = v, n
        for _, _, i, _ in gains[best_n:]:
            drafts[i] = []
            self._reqs[req_ids[i]].source = None

    def _trace(self, i, sampled, context, draft) -> None:
        with open(self._trace_path, "a") as f:
            f.write(json.dumps({"req": self.runner.input_batch.req_ids[i], "t": time.perf_counter(),
                                "sampled": list(sampled), "context": list(map(int, context)), "draft": draft}) + "\n")

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs):
        now = time.perf_counter()
        batch = self.runner.input_batch
        nreq = len(sampled_token_ids)
        req_ids = batch.req_ids[:nreq]
        specs = batch.spec_token_ids
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
                r = self._reqs[req_ids[i]] = _Req(self.masks, self.options)
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
            chains = self._chains(stash, wants_chain, sampled_token_ids) if stash is not None else {}
            for i, k in wants_chain.items():
                chain, probs = chains.get(i, ([], None))
                chain = chain[: min(self.num_spec, self.max_model_len - int(num_tokens_no_spec[i]) - 1) - k]
                if probs is not None and mask_cost is not None:  # adaptive: as far as the drafter is sure
                    chain = chain[: self._reqs[req_ids[i]].policy.confident(probs[: len(chain)], mask_cost, k)]
                drafts[i] = chain + [self.mask_id] * k
                self._reqs[req_ids[i]].source = "masks"
        if self.adaptive and not probe and any(drafts):
            self._decide(drafts, req_ids, sampled_token_ids, active)
        self._plain_run = 0 if any(drafts) else self._plain_run + 1
        empty = 0
        for i, sampled in enumerate(sampled_token_ids):
            if sampled:
                empty += not drafts[i]
                if drafts[i] and drafts[i][-1] == self.mask_id:
                    self.stats["mask_drafts"] += 1
                    self.stats["chain_tokens"] += drafts[i].index(self.mask_id)
                elif drafts[i]:
                    self.stats["lookup_drafts"] += 1
                if self._trace_path:
                    self._trace(i, sampled, token_ids_cpu[i, : int(num_tokens_no_spec[i])], drafts[i])
        self.stats["empty_drafts"] += empty
        self.stats["engine_steps"] += 1
        self.stats["plain_engine_steps"] += not any(drafts)
        self.stats["forwards"] = self.model.sbd_forwards
        self.stats["eager_forwards"] = self.model.sbd_eager_forwards()
        if len(self._reqs) > 4 * max(8, nreq):  # forget finished requests
            self._reqs = {k: v for k, v in self._reqs.items() if v.seen >= self._step - 1}
        if self._stats_path:
            with open(self._stats_path, "w") as f:
                json.dump(self.stats, f)
        return drafts
