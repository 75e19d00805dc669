"""The decoding engine: rows that each progress on their own, batched into one model call per step.

Every row (a prompt being decoded, `sbd.decoding.rows`) owns a slot of the KV cache with its own length,
position and decoding state. A step asks every row what it feeds (`Feed`: tokens, how many of them
are committed causally, how many logits it needs), lays the feeds out right-aligned in one (B, W)
input (padding columns at the front, which write into scratch positions after the row's real tokens
and see only the row's first real token), makes ONE model call (`sbd.decoding.forward`, which alone
knows how the model is called), reads from the device ONCE for all rows, and lets
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

import math
import time
from collections import Counter
from dataclasses import dataclass

import torch

from ..errors import SBDError
from .cache import slot_cache
from .forward import Feed, ModelForward
from .proposers.head import Drafting

PREFILL_MODES = ("separate", "mixed")
ATTENTION = ("auto", "dense")
STATIC_CAPACITY_STEP = 256


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


def bucket(n: int) -> int:
    """The batch a fixed-shape forward of `n` rows runs at: the next power of two, so that a compiled
    step has a few batch shapes, not one per count of live rows (the cache holds `bucket(slots)` rows)."""
    return 1 << max(n - 1, 0).bit_length()


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
    causal_blocks: masks attend causally among themselves too, as an engine with causal attention only
    gives them (vLLM's CPU backend): a measurement switch, exact either way for sbd-verify.
    step_cost: told the width and wall time of every decoding step (`sbd.decoding.width_cost.StepCost`),
    from which adaptive drafting prices wider steps. lean: eager forwards through sbd's own forward of
    Llama-family models where it supports the model (None) or never (False; `sbd.decoding.llama_forward`).
    """

    def __init__(self, model, slots: int, capacity: int, *, max_width: int = 72, observer=None,
                 static_widths=(), call=None, prefill: str = "separate", attention: str = "auto",
                 causal_blocks: bool = False, step_cost=None, lean: bool | None = None):
        if prefill not in PREFILL_MODES:
            raise SBDError(f"unknown prefill mode {prefill!r}; choose one of {', '.join(PREFILL_MODES)}")
        if attention not in ATTENTION:
            raise SBDError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTION)}")
        self.model = model
        self.forward = ModelForward(model, attention, lean)  # how the model is called (attention plan, gate, capture)
        self.device = self.forward.device
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
        # masks attend causally among themselves too: what an engine whose attention is causal only gives
        # them (vLLM on a CPU); a measurement switch (docs/serving.md), exact either way for sbd-verify
        self.causal_blocks = bool(causal_blocks)
        self.step_cost = step_cost if hasattr(step_cost, "add") else None
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
        if hasattr(row, "draw_on"):  # a sampling row's generator goes where its logits are (`Row.draw_on`)
            row.draw_on(self.device)
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
        decoding = not any(r.in_prefill for r in rows)  # a step whose time prices wider steps
        static = bool(self.static_widths) and decoding
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
        lengths = self._lengths[lo:hi] + [0] * (len(feeds) - len(rows))
        step = self.forward.inputs(feeds, lengths, width, visible, static=static, causal_blocks=self.causal_blocks,
                                   observed=self.observer is not None)
        self.plans[step.plan] += 1
        keep = max(n_logits, 1)  # (0 would mean "all" to transformers)
        call = self.call if static else self.model
        head = self._drafting_head(rows, call)
        started = time.perf_counter()
        out, hidden = self.forward(step, self.cache, lo, logits_to_keep=width if static else keep, call=call,
                                   head=head)  # static: one graph per width
        tokens, pos, mask = step.tokens, step.pos, step.mask
        n_rows = len(rows)  # the real rows (a static batch's idle slots after them are dropped here)
        logits = out.logits[:n_rows, -keep:]
        hidden = hidden[:n_rows, -keep:] if head is not None else None  # the output layer's input at the kept positions
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
        if self.step_cost is not None and decoding:  # from the forward to its one host read (a GPU sync)
            self.step_cost.add(width, time.perf_counter() - started,
                               masks=any(len(f.tokens) > f.n_commit for f in feeds))
            # the rows about to pick their next drafts share this forward with n_rows - 1 others (a server's
            # lone request, or a batch's last row, decodes alone: `best_draft_length` charges its restarts)
            self.step_cost.rows = n_rows
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
        head = self.forward.sampler_head
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
