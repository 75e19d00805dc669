"""The engine's forward: one call of the model over the slot cache, and the only place that knows how.

A decoding forward is the model called on the rows' feeds (`Feed`) laid out right-aligned in one (B, W)
input, over the per-row slot cache (`sbd.decoding.cache`), with an attention plan
(`sbd.decoding.attention`: no dense mask where the rows allow), the drafting adapter's gate on each
row's block and, when a row drafts with it, the sampler head's input captured. `ModelForward` reads what
that needs from the model once. The engine's steps and the timing of wider forwards
(`sbd.decoding.width_cost`) both call it, so the cost adaptive drafting trades against is the cost of
the forward decoding runs, and rows never know which kernel runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from dataclasses import dataclass

import torch

from ..drafters.adapter import adapter_of
from ..drafters.sampler_head import capture_output_input, head_of
from ..errors import SBDError
from ..masks import tree_mask
from ..models.cache_arg import cache_name
from ..models.narrow_linear import uses_narrow_linear
from ..models.quantized import row_invariant
from . import llama_forward
from .attention import (StepLayout, exact_plan, flash_causal, fold_for, head_groups, routed, rows_plan, supports,
                        uniform_plan)


@dataclass
class Feed:
    """What a row feeds into the next forward: `tokens` (host list), of which the first `n_commit` are
    committed causally (kept in the cache) and the rest form one bidirectional block (scratch);
    `n_logits` logits are returned for its last positions.

    parents (optional): the committed part is a tree, not a chain: `parents[i]` (< i, or -1 for a token
    that hangs from the cache directly; parents[0] = -1) is committed token i's parent. Token i then sees
    the cache, itself and its ancestors (`sbd.masks.tree_mask`) at position cache length + its depth; the
    block after the committed part follows the LAST committed token: it sees the cache, that token and
    its ancestors, and the whole block, at the positions right after that token. None: a chain (each
    committed token sees the earlier ones), the same as parents [-1, 0, 1, …]."""

    tokens: list[int]
    n_commit: int
    n_logits: int
    parents: list[int] | None = None


def columns(n_real: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width): each column's index among its row's real tokens (rows right-aligned); < 0 for padding."""
    return torch.arange(width, device=n_real.device)[None] - (width - n_real)[:, None]


def step_mask(lengths: torch.Tensor, n_real: torch.Tensor, n_commit: torch.Tensor, width: int,
              visible: int, j: torch.Tensor | None = None, causal_blocks: bool = False) -> torch.Tensor:
    """(B, 1, width, visible) bool mask of one engine forward (True = may attend).

    Row b has `lengths[b]` cached positions and feeds `n_real[b]` tokens right-aligned in `width`
    columns, the first `n_commit[b]` causal, the rest one block. Its tokens sit at cache positions
    lengths[b] … lengths[b] + n_real[b] − 1. Causal queries see the cache and the earlier new tokens;
    block queries see the cache and every new token; padding queries see the row's first new token only
    (no attention row may be empty). j: `columns(n_real, width)`, if the caller has it already.
    causal_blocks: block queries too see only the new tokens up to themselves (what an engine with causal
    attention only, such as vLLM's CPU backend, gives the masks)."""
    j = columns(n_real, width) if j is None else j
    rel = torch.arange(visible, device=lengths.device)[None, None] - lengths[:, None, None]  # (B, 1, visible)
    causal = (j < n_commit[:, None])[..., None] if not causal_blocks else torch.ones_like(j, dtype=torch.bool)[..., None]
    new = (rel >= 0) & (rel < n_real[:, None, None]) & (~causal | (rel <= j[..., None]))
    real = (j >= 0)[..., None]
    return ((real & ((rel < 0) | new)) | (~real & (rel == 0)))[:, None]


def tree_layout(mask: torch.Tensor, pos: torch.Tensor, feeds: list[Feed], lengths: list[int]) -> None:
    """The rows whose committed part is a tree (`Feed.parents`): their masks over their own new tokens
    and their position ids, in place. `step_mask` made the chain layout; only the committed keys (cache
    positions length … length + n_commit − 1) and the positions of the real columns change. Built on
    the host for all tree rows, sent in two copies."""
    width = mask.shape[-2]
    rows, seen, offsets = [], [], []
    for b, f in enumerate(feeds):
        if f.parents is None:
            continue
        n, c = len(f.tokens), f.n_commit
        if len(f.parents) != c:
            raise ValueError(f"Feed.parents names {len(f.parents)} parents for {c} committed tokens")
        sees = tree_mask(f.parents)  # (c, c): committed token i sees itself and its ancestors
        sees = torch.cat([sees, sees[-1:].expand(n - c, c)])  # the block follows the last committed token
        depth = (sees[:c].sum(-1) - 1).tolist() if c else [-1]  # a token's depth: its count of ancestors
        rows.append((b, n, c))
        seen.append(sees.flatten())
        offsets += depth[:c] + list(range(depth[-1] + 1, depth[-1] + 1 + n - c))
    if not rows:
        return
    seen_d = torch.cat(seen).to(mask.device)
    offsets_d = torch.tensor(offsets, dtype=pos.dtype).to(pos.device)
    at_m = at_p = 0
    for b, n, c in rows:
        first, length = width - n, lengths[b]
        mask[b, 0, first:, length : length + c] = seen_d[at_m : at_m + n * c].view(n, c)
        pos[b, first:] = length + offsets_d[at_p : at_p + n]
        at_m, at_p = at_m + n * c, at_p + n


@dataclass
class StepInputs:
    """One forward's inputs, laid out: tokens and positions (B, W), where each column writes in its row's
    slot (`write_at`), how many cache positions the forward sees (`visible`), the dense mask (None when
    the attention plan needs none and nobody observes the step), the attention plan (`layout`, when the
    model's attention is routed) and where each row's block starts (`gate`: the adapter acts from there;
    one int when all rows agree; None for a model without an adapter). write_from: where every row writes
    its columns when all rows have one length and no padding (one slice copy per layer instead of a
    scatter); None otherwise."""

    tokens: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor | None
    write_at: torch.Tensor
    visible: int
    layout: StepLayout | None
    gate: int | torch.Tensor | None
    write_from: int | None = None

    @property
    def plan(self) -> str:
        """The attention plan taken: "open", "split", "rows", "exact" (`sbd.decoding.attention`), or "dense"."""
        return self.layout.plan if self.layout is not None else "dense"


class ModelForward:
    """How sbd calls `model` while decoding, read from the model once.

    attention: "auto" routes a transformers SDPA model's attention through `sbd.decoding.attention` (no
    dense mask where the rows allow, key/value heads never copied); "dense" gives the model the dense
    (B, 1, W, S) mask (other models always get it).
    lean: run eager forwards through sbd's own forward of Llama-family models (`sbd.decoding.llama_forward`:
    transformers' logits bit for bit, without its module overhead) where it supports the model (None, the
    default) or never (False: transformers' modules, for comparisons). `self.lean` is None when it does not
    run; `self.why_not_lean` says why."""

    def __init__(self, model, attention: str = "auto", lean: bool | None = None):
        emb = model.get_input_embeddings().weight
        self.model = model
        self.device, self.dtype = emb.device, emb.dtype  # dtype: a folded mask's (read once, not per step)
        self.keep_kw = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache_kw = cache_name(model)  # transformers >= 5.24 calls it `cache`
        self.adapter = adapter_of(model)
        self.sampler_head = head_of(model)
        self.routed = attention == "auto" and supports(model)
        self.fold = fold_for(self.device, head_groups(model)) if self.routed else 1
        self.flash = self.routed and flash_causal(model)
        self.narrow = uses_narrow_linear(model)  # part of what a forward's time depends on (`shape`)
        # row-invariant linear layers (quantized weights): attention per committed token, so that a wide
        # forward's committed positions are bitwise NTP's one-token forwards ("exact" plan)
        invariant = row_invariant(model)
        self.why_not_lean = ("it was switched off" if lean is False else None if self.routed else
                             "its attention is not routed through sbd's") or llama_forward.supported(model)
        self.lean = llama_forward.LlamaForward(model) if self.why_not_lean is None else None
        if self.lean is not None and self.lean.foreign_hooks():
            self.lean, self.why_not_lean = None, "its decoder layers carry forward hooks"
        # float32 layers on sbd's own product (`own_kernels.FloatProduct`) are row-invariant too, in forwards
        # of up to FLOAT_ROWS positions; tree drafts keep the masked plans there (`inputs`)
        self.float_exact = self.routed and not invariant and self.lean is not None and self.lean.float_invariant
        self.exact = self.routed and invariant or self.float_exact
        if invariant and not self.routed:  # else sbd-verify would leave NTP's tokens, silently
            why = ("attention='dense' was asked for" if attention != "auto" else
                   f"its attention is {getattr(model.config, '_attn_implementation', None)!r}, not transformers' 'sdpa'")
            raise SBDError(f"quantized weights decode only through sbd's exact attention, which this model cannot "
                           f"take ({why}); load it with attn_implementation='sdpa', or without weights=")

    @functools.cached_property
    def shape(self) -> tuple[str, ...]:
        """What the time of a forward depends on besides its width and batch, not the weights: the
        model's config, dtype, device, narrow layers, a drafting adapter's rank and the attention path."""
        config = self.model.config.to_dict()
        for k in ("_name_or_path", "name_or_path", "transformers_version", "sbd_decoding", "sbd_trained_for"):
            config.pop(k, None)
        gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else ""
        rank = self.adapter.config.r if self.adapter is not None else 0
        return (json.dumps(config, sort_keys=True, default=str), str(self.dtype), str(self.device), gpu,
                str(self.narrow), str(rank), "exact" if self.exact else "routed" if self.routed else "dense",
                str(getattr(self.model.config, "sbd_weights", None)), "lean" if self.lean is not None else "")

    def inputs(self, feeds: list[Feed], lengths: list[int], width: int, visible: int, *, static: bool = False,
               causal_blocks: bool = False, observed: bool = False) -> StepInputs:
        """Lay the rows' feeds out for one forward: right-aligned in `width` columns over caches of
        `lengths` committed positions, seeing `visible` positions. static: fixed shapes (a compiled step),
        always the per-row plan. observed: build the dense mask even where the plan needs none."""
        dev = self.device
        real = [len(f.tokens) for f in feeds]
        ids = [[0] * (width - n) + f.tokens for f, n in zip(feeds, real)]
        tokens = torch.tensor(ids, dtype=torch.long, device=dev)
        L = torch.tensor(lengths, dtype=torch.long, device=dev)
        n = torch.tensor(real, dtype=torch.long, device=dev)
        c = torch.tensor([f.n_commit for f in feeds], dtype=torch.long, device=dev)
        j = columns(n, width)
        pos = (L[:, None] + j).clamp_min(0)
        tree = any(f.parents is not None for f in feeds)
        exact = self.exact and not static and not (tree and self.float_exact)
        if exact and tree:
            raise ValueError("tree feeds have no exact attention plan (DecodeSpec refuses trees on quantized weights)")
        flush = not static and len(set(lengths)) == 1 and min(real) == width  # one length, no padding
        uniform = (self.routed and flush and not exact and len({f.n_commit for f in feeds}) == 1
                   and all(f.parents is None for f in feeds))
        mask = None
        if (not uniform and not exact) or observed:
            mask = step_mask(L, n, c, width, visible, j, causal_blocks)
            tree_layout(mask, pos, feeds, lengths)
        layout = None
        if exact:  # a feed without logits is a prefill (`Row.feed`): its prompt attends in one causal call
            layout = exact_plan([(length, len(f.tokens), f.n_commit, f.n_logits == 0)
                                 for length, f in zip(lengths, feeds)], width, causal_blocks)
        elif self.routed:
            layout = (uniform_plan(lengths[0], feeds[0].n_commit, width, causal_blocks, self.flash, dev) if uniform
                      else rows_plan(mask, self.fold, self.dtype))
        write_at = L[:, None] + torch.where(j >= 0, j, j + width)  # padding writes after the row's real tokens
        gate = None
        if self.adapter is not None:  # the block part of each row (after its committed tokens)
            starts = [width - n_ + f.n_commit for n_, f in zip(real, feeds)]
            one = len(set(starts)) == 1 and not static  # static: always per row, so the graph never changes
            gate = starts[0] if one else torch.tensor(starts, device=dev)
        return StepInputs(tokens, pos, mask, write_at, visible, layout, gate, lengths[0] if flush else None)

    def __call__(self, step: StepInputs, cache, lo: int = 0, *, logits_to_keep: int, call=None, head=None):
        """Run one forward over cache slots lo … lo + B − 1; returns (model output, the output layer's
        input when `head` is given, else None). call: what to call instead of the model (a compiled
        step); head: the sampler head whose input to capture (an eager call only: hooks)."""
        hi = lo + step.tokens.shape[0]
        for layer in cache.layers:
            layer.lo, layer.hi, layer.visible, layer.write_at = lo, hi, step.visible, step.write_at
            layer.write_from = step.write_from
        kw = {"logits_to_keep": logits_to_keep} if self.keep_kw else {}
        if self.routed:
            kw["sbd_layout"] = step.layout
        if self.adapter is not None:
            self.adapter.start = step.gate
        lean = self.lean if call in (None, self.model) else None
        call = self.model if call is None else call
        try:
            with (capture_output_input(self.model) if head is not None else contextlib.nullcontext() as box,
                  routed(self.model, self.routed and lean is None)):
                if lean is not None:
                    out = lean(step.tokens, step.pos, cache, step.layout, logits_to_keep)
                else:
                    out = call(input_ids=step.tokens, position_ids=step.pos,
                               attention_mask=None if self.routed else step.mask,
                               **{self.cache_kw: cache}, use_cache=True, **kw)
        finally:
            if self.adapter is not None:
                self.adapter.start = None
        return out, (box[0] if head is not None else None)
