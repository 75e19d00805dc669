"""The decoding engine: rows that each progress on their own, batched into one model call per step.

Every row (a prompt being decoded, `sbd.decoding.rows`) owns a slot of the KV cache with its own length,
position and decoding state. A step asks every row what it feeds (`Feed`: tokens, how many of them
are committed causally, how many logits it needs), lays the feeds out right-aligned in one (B, W)
input (padding columns at the front, which write into scratch positions after the row's real tokens
and see only the row's first real token), makes ONE model call, reads from the device ONCE for all rows, and lets
every row take its decision. A row's tokens therefore never depend on its neighbours (batch = alone),
rows leave the moment they finish (their slot is refilled by the last row) and new rows may join
between steps (continuous batching). Prefill of newcomers runs as its own forward ("separate") or
inside the shared decoding forward ("mixed").

A row's committed part may also be a tree (`Feed.parents`: each token sees the cache and its own
ancestors only), and after its decision a row may keep any increasing subset of its committed tokens
instead of a prefix: the engine moves their keys and values together (`SlotLayer.compact`). That is
all the engine knows of tree drafts (`sbd.decoding.trees`).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections import Counter
from dataclasses import dataclass

import torch

from ..drafters.adapter import adapter_of
from ..errors import SBDError
from ..masks import tree_mask
from ..models.cache_arg import cache_name
from ..drafters.sampler_head import Drafting, capture_output_input, head_of
from .attention import flash_causal, fold_for, head_groups, routed, rows_plan, supports, uniform_plan
from .cache import slot_cache

PREFILL_MODES = ("separate", "mixed")
ATTENTION = ("auto", "dense")
STATIC_CAPACITY_STEP = 256


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


@dataclass
class ForwardRecord:
    """One model call as the engine made it, for tests and tracing (see `observer`). `n_commit` is the
    largest count of committed tokens over the rows (`commits` per row); `lengths` the rows' cache
    lengths before the call; rows are right-aligned in `input_ids` (padding first), `reals[i]` tokens each."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    logits: torch.Tensor
    n_commit: int
    cache: object
    rows: list
    commits: list[int]
    lengths: list[int]
    reals: list[int]

    def committed(self, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row i's cached keys and values per layer right after this call (committed positions only; a
        tree feed's nodes all sit there until the row's answer keeps one path)."""
        n = self.lengths[i] + self.commits[i]
        return [(layer.keys[i, :, :n], layer.values[i, :, :n]) for layer in self.cache.layers]


CAUSAL_BLOCKS = False  # the default of `Engine.causal_blocks` (benchmarks/vllm/causal_masks.py sets it)
ATTENTION_DEFAULT = "auto"  # the default of `Engine(attention=None)` (tests/test_attention.py compares "dense")


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


def bucket(n: int) -> int:
    """The batch a fixed-shape forward of `n` rows runs at: the next power of two, so that a compiled
    step has a few batch shapes, not one per count of live rows (the cache holds `bucket(slots)` rows)."""
    return 1 << max(n - 1, 0).bit_length()


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


class Engine:
    """Rows decoded together, each at its own pace (module docstring).

    slots: the most rows at once; capacity: cache positions per row (prompt + budget + scratch).
    max_width: the widest decoding forward (a verify step: 2·block + 1; a lookup draft: 1 + lookup_max;
    a row's `needs_extra`); padding of a forward writes up to that far past a row's end, so a row wider
    than that is refused. static_widths: pad every decoding forward to one of these widths over
    the whole cache, so shapes repeat (for `call`, e.g. a compiled model); prefills run eagerly.
    attention: "auto" routes a transformers SDPA model's attention through `sbd.decoding.attention`
    (no dense mask where the rows allow, key/value heads never copied; `plans` counts which plan each
    forward took); "dense" gives the model the dense (B, 1, W, S) mask, as before (other models always).
    """

    def __init__(self, model, slots: int, capacity: int, *, max_width: int = 72, observer=None,
                 static_widths=(), call=None, prefill: str = "separate", attention: str | None = None):
        if prefill not in PREFILL_MODES:
            raise SBDError(f"unknown prefill mode {prefill!r}; choose one of {', '.join(PREFILL_MODES)}")
        attention = ATTENTION_DEFAULT if attention is None else attention
        if attention not in ATTENTION:
            raise SBDError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTION)}")
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.static_widths = sorted(static_widths)
        if self.static_widths:  # a multiple of 256, so that calls of different budgets share shapes
            capacity = -(-capacity // STATIC_CAPACITY_STEP) * STATIC_CAPACITY_STEP
        self.slots, self.capacity = slots, capacity
        # Padding columns write after the row's real tokens: up to one forward's width past its end. A
        # mixed prefill makes a decoding row's forward as wide as a newcomer's prompt.
        # With fixed shapes every decoding forward is one of the static widths (prefills run with no cache
        # behind them, so their padding stays inside the capacity).
        if prefill == "mixed":
            self.trash = capacity
        else:
            self.trash = max(self.static_widths) if self.static_widths else max(max_width, 1)
        self.cache = None
        self._rows: list = []  # live rows; row i sits in cache slot i (moved only with it: `_swap`)
        self._lengths: list[int] = []
        self.observer = observer
        self.call = model if call is None else call
        self.prefill = prefill
        self.keep_kw = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache_kw = cache_name(model)  # transformers >= 5.24 calls it `cache`
        self.adapter = adapter_of(model)
        self.sampler_head = head_of(model)  # drafts with it while it is enabled (`sbd.drafters.sampler_head`)
        # masks attend causally among themselves too: what an engine whose attention is causal only gives
        # them (vLLM on a CPU); a measurement switch (docs/serving.md), exact either way for sbd-verify
        self.causal_blocks = CAUSAL_BLOCKS
        self.routed = attention == "auto" and supports(model)
        self.fold = fold_for(self.device, head_groups(model)) if self.routed else 1
        self.flash = self.routed and flash_causal(model)
        self.dtype = model.get_input_embeddings().weight.dtype  # a folded mask's dtype (read once, not per step)
        self.plans: Counter = Counter()  # forwards per attention plan ("dense" when not routed)

    # -- rows ----------------------------------------------------------------------------------------
    # Row i always sits in cache slot i. The row list, the lengths and the cache slots change only
    # together, in `add` (a new slot at the end) and `_swap` (two rows exchange places with their
    # slots); everything else reads them. So a row's cache goes wherever the row goes.
    @property
    def rows(self) -> tuple:
        """The live rows; row i sits in cache slot i (read-only: rows move only with their caches)."""
        return tuple(self._rows)

    @property
    def lengths(self) -> tuple[int, ...]:
        """Committed cache positions of each live row (read-only)."""
        return tuple(self._lengths)

    def add(self, row) -> None:
        """A row joins; its prefill runs in the next step."""
        if len(self._rows) >= self.slots:
            raise SBDError(f"the engine is full ({self.slots} rows)")
        if row.needs > self.capacity:
            raise SBDError(f"prompt and budget need {row.needs} cache positions; this engine holds {self.capacity}")
        if getattr(row, "needs_extra", 0) > self.trash and not self.static_widths:  # padding: past the scratch
            raise SBDError(f"this row's forwards are up to {row.needs_extra} tokens wide; this engine's are at most "
                           f"{self.trash} (max_width): lower block_size or lookup_max")
        if row in self._rows:
            raise SBDError("this row is already in the engine")
        self._rows.append(row)
        self._lengths.append(0)

    def remove(self, row) -> None:
        """Take a row out (finished or abandoned): the last row moves into its slot, with its cache."""
        i = self._rows.index(row)
        self._swap(i, len(self._rows) - 1)
        self._rows.pop()
        self._lengths.pop()

    def _swap(self, i: int, j: int) -> None:
        """Rows i and j exchange places together with their cache slots (the only way rows move)."""
        if i == j:
            return
        if self.cache is not None:
            for layer in self.cache.layers:
                layer.swap(i, j, self._lengths[i], self._lengths[j])
        self._rows[i], self._rows[j] = self._rows[j], self._rows[i]
        self._lengths[i], self._lengths[j] = self._lengths[j], self._lengths[i]

    def _newcomers_last(self) -> int | None:
        """Put the rows still to prefill after all the others (each row with its cache); the index of the
        first of them, or None when there is none."""
        lo, hi = 0, len(self._rows) - 1
        while True:
            while lo <= hi and not self._rows[lo].in_prefill:
                lo += 1
            while hi >= lo and self._rows[hi].in_prefill:
                hi -= 1
            if lo >= hi:
                return lo if lo < len(self._rows) else None
            self._swap(lo, hi)

    @property
    def live(self) -> int:
        return len(self._rows)

    # -- one step ------------------------------------------------------------------------------------
    def step(self) -> list:
        """Prefill newcomers (separate mode) and run one decoding forward for every row; returns the rows
        that finished in it (already removed)."""
        if self.prefill == "separate":
            first = self._newcomers_last()
            if first is not None:
                self._run(first, len(self._rows))
        done = self._run(0, len(self._rows)) if self._rows else []
        for row in done:
            self.remove(row)
        return done

    def _run(self, lo: int, hi: int) -> list:
        rows = self._rows[lo:hi]
        static = bool(self.static_widths) and not any(r.in_prefill for r in rows)
        feeds = [r.feed() for r in rows]
        if static:  # fixed shapes: idle slots fill the batch up to its bucket, with nothing real to feed
            feeds += [Feed([], 0, 0)] * (bucket(len(rows)) - len(rows))
        real = [len(f.tokens) for f in feeds]
        width = max(real)
        if static:
            width = next((w for w in self.static_widths if w >= width), width)
        visible = self.capacity if static else max(self._lengths[lo + i] + real[i] for i in range(len(rows)))
        if self.cache is None:
            slots = bucket(self.slots) if self.static_widths else self.slots
            self.cache = slot_cache(self.model, slots, self.capacity, self.trash, bool(self.static_widths))
        n_logits = max(f.n_logits for f in feeds)
        ids = [[0] * (width - n) + f.tokens for f, n in zip(feeds, real)]
        lengths = self._lengths[lo:hi] + [0] * (len(feeds) - len(rows))
        hi = lo + len(feeds)
        dev = self.device
        tokens = torch.tensor(ids, dtype=torch.long, device=dev)
        L = torch.tensor(lengths, dtype=torch.long, device=dev)
        n = torch.tensor(real, dtype=torch.long, device=dev)
        c = torch.tensor([f.n_commit for f in feeds], dtype=torch.long, device=dev)
        j = columns(n, width)
        pos = (L[:, None] + j).clamp_min(0)
        uniform = (self.routed and not static and len(set(lengths)) == 1 and min(real) == width
                   and len({f.n_commit for f in feeds}) == 1 and all(f.parents is None for f in feeds))
        mask = None
        if not uniform or self.observer is not None:
            mask = step_mask(L, n, c, width, visible, j, self.causal_blocks)
            tree_layout(mask, pos, feeds, lengths)
        extra = {}
        if self.routed:
            layout = (uniform_plan(lengths[0], feeds[0].n_commit, width, self.causal_blocks, self.flash, dev) if uniform
                      else rows_plan(mask, self.fold, self.dtype))
            extra["sbd_layout"] = layout
        self.plans[extra["sbd_layout"].plan if self.routed else "dense"] += 1
        write_at = L[:, None] + torch.where(j >= 0, j, j + width)  # padding writes after the row's real tokens
        for layer in self.cache.layers:
            layer.lo, layer.hi, layer.visible, layer.write_at = lo, hi, visible, write_at
        keep = max(n_logits, 1)  # (0 would mean "all" to transformers)
        kw = {"logits_to_keep": width if static else keep} if self.keep_kw else {}  # static: one graph per width
        if self.adapter is not None:  # gate: the block part of each row (after its committed tokens)
            starts = [width - n_ + f.n_commit for n_, f in zip(real, feeds)]
            one = len(set(starts)) == 1 and not static  # static: always per row, so the graph never changes
            self.adapter.start = starts[0] if one else torch.tensor(starts, device=dev)
        call = self.call if static else self.model
        head = self._drafting_head(rows, call)
        try:
            with (capture_output_input(self.model) if head is not None else contextlib.nullcontext() as box,
                  routed(self.model, self.routed)):
                out = call(input_ids=tokens, position_ids=pos, attention_mask=None if self.routed else mask,
                           **{self.cache_kw: self.cache}, use_cache=True, **kw, **extra)
        finally:
            if self.adapter is not None:
                self.adapter.start = None
        n_rows = len(rows)  # the real rows (a static batch's idle slots after them are dropped here)
        logits = out.logits[:n_rows, -keep:]
        hidden = box[0][:n_rows, -keep:] if head is not None else None  # the output layer's input at the kept positions
        if n_rows < len(feeds):
            tokens, pos, mask = tokens[:n_rows], pos[:n_rows], mask[:n_rows] if mask is not None else None
            feeds, real, lengths = feeds[:n_rows], real[:n_rows], lengths[:n_rows]
        for i, f in enumerate(feeds):
            self._lengths[lo + i] += f.n_commit
        if self.observer is not None:
            self.observer(ForwardRecord(tokens, pos, mask, logits, max(f.n_commit for f in feeds), self.cache,
                                        rows, [f.n_commit for f in feeds], lengths, real))
        # Every row says what it must know on the host; ONE read for all of them (a GPU sync per step).
        asks = [self._ask(r, logits[i, keep - f.n_logits:], head, hidden, i) if f.n_logits else None
                for i, (r, f) in enumerate(zip(rows, feeds))]
        parts = [a for a in asks if a is not None and a.numel()]
        check = logits.amax(-1).sum().double().reshape(1)
        values = torch.cat([check] + [p.double() for p in parts]).tolist()
        if not math.isfinite(values[0]):
            raise SBDError("the model returned NaN or infinite logits; decoding stopped (check the weights and dtype)")
        at, done = 1, []
        for i, (r, a) in enumerate(zip(rows, asks)):
            m = a.numel() if a is not None else 0
            drop = r.answer(values[at : at + m])
            at += m
            if isinstance(drop, int):
                self._lengths[lo + i] -= drop
            else:
                self._keep(lo + i, lengths[i], feeds[i].n_commit, drop)
            if r.finished:
                done.append(r)
        return done

    def _drafting_head(self, rows, call):
        """The sampler head, when it is enabled, the model is called eagerly (a compiled call may not run
        hooks) and some row drafts with it in this step; else None (and nothing is captured)."""
        head = self.sampler_head
        if head is None or not head.enabled or call is not self.model:
            return None
        return head if any(getattr(r, "drafts_with_head", False) for r in rows) else None

    def _ask(self, row, logits, head, hidden, i: int):
        if hidden is not None and getattr(row, "drafts_with_head", False):
            return row.ask(logits, drafting=Drafting(head, self.model, hidden[i, hidden.shape[1] - logits.shape[0]:]))
        return row.ask(logits)

    def _keep(self, slot: int, start: int, n_commit: int, keep) -> None:
        """After a forward that committed `n_commit` tokens at `start`, the row keeps only the committed
        feed positions `keep` (increasing): they move to start, start + 1, … and the length follows.
        The slot's contents and its length change together, here, as everywhere."""
        keep = [int(k) for k in keep]
        if any(b <= a for a, b in zip(keep, keep[1:])) or (keep and not 0 <= keep[0] <= keep[-1] < n_commit):
            raise ValueError(f"a row may keep increasing positions among its {n_commit} committed ones, got {keep}")
        if keep != list(range(len(keep))):  # a prefix stays where it is
            moved = torch.tensor(keep, dtype=torch.long, device=self.device)
            for layer in self.cache.layers:
                layer.compact(slot, start, moved)
        self._lengths[slot] = start + len(keep)
