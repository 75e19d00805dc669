"""The two decoding loops, NTP and SBD, over one exact KV cache (docs/method.md §3).

`LiveRows.forward` is the only place that calls the model: it builds positions and the 4-D mask,
appends the forward's committed tokens to the cache and drops its scratch (block) entries. The loops
decide what to feed and what to keep; `FinishedRows` collects each row as it stops.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..adapter import adapter_of
from ..errors import SBDError
from ..masks import inference_mask
from ..sampler import entropy_and_argmax, error_proxy, pick_tokens, reveal_from_proxy
from .cache import crop, select_rows, set_writes, slab_cache


@dataclass
class ForwardRecord:
    """One model call as the decoding loop made it, for tests and tracing (see `observer`)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    logits: torch.Tensor
    n_commit: int
    cache: object
    rows: torch.Tensor


STATIC_CAPACITY_STEP = 256


class LiveRows:
    """The rows still being decoded: their cache, left padding and original indices.

    static_widths: when given, every forward of width q ≤ max(static_widths) is padded with dead tokens
    to the smallest listed width ≥ q and runs over the whole (static) cache, so that a forward's shapes
    never change: `call` (e.g. a compiled model) then sees a handful of shapes only. Dead tokens see only
    themselves and nobody sees them, so the logits are those of the unpadded forward.
    """

    def __init__(self, model, pad: torch.Tensor, capacity: int, observer=None, static_widths=(), call=None):
        self.model = model
        self.pad = pad
        self.rows = torch.arange(pad.shape[0], device=pad.device)
        self.index = list(range(pad.shape[0]))  # the same original row numbers, on the host (no sync to read)
        self.static_widths = sorted(static_widths)
        self.capacity = capacity
        if self.static_widths:  # room for the padding; a multiple of 256, so that calls share shapes
            self.capacity = -(-(capacity + self.static_widths[-1]) // STATIC_CAPACITY_STEP) * STATIC_CAPACITY_STEP
        self.cache = slab_cache(model, self.capacity, static=bool(self.static_widths))
        self.length = 0
        self.observer = observer
        self.call = model if call is None else call
        self.keep_kw = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.adapter = adapter_of(model)  # a drafting adapter acts on the block part of each forward only
        self._key = None

    def _static_width(self, q: int) -> int | None:
        return next((w for w in self.static_widths if w >= q), None)

    def forward(self, tokens: torch.Tensor, n_commit: int, n_logits: int) -> torch.Tensor:
        """Feed `tokens` (B, q): the first `n_commit` causally (kept in the cache), the rest as one
        bidirectional block (scratch, dropped after the call). Returns the last `n_logits` logits."""
        q = tokens.shape[1]
        width = self._static_width(q) if self.static_widths else None
        key = (self.length, n_commit, q, width)
        if key != self._key:  # the forwards inside a block share positions and mask: build them once
            self._build(n_commit, q, width)
            self._key = key
        pos, mask = self._pos, self._mask
        call = self.model
        if self.static_widths:
            set_writes(self.cache, self._writes, self.length)  # where this forward writes; length moves after
            if width is not None:
                padded = tokens.new_zeros((tokens.shape[0], width))  # fresh and contiguous: same strides
                padded[:, :q] = tokens
                tokens = padded
                if self.length:  # the first forward (prefill) runs eagerly: it allocates the cache
                    call = self.call
        keep = n_logits + (width - q if width is not None else 0)
        kw = {"logits_to_keep": keep} if self.keep_kw else {}
        if self.adapter is not None:
            self.adapter.start = n_commit  # gate: 0 on the committed (causal) tokens, 1 on the block
        try:
            out = call(
                input_ids=tokens,
                position_ids=pos,
                attention_mask=mask,
                past_key_values=self.cache,
                use_cache=True,
                **kw,
            )
        finally:
            if self.adapter is not None:
                self.adapter.start = None
        logits = out.logits[:, -keep:][:, :n_logits]
        if self.static_widths:
            set_writes(self.cache, self._writes, self.length + n_commit)
        else:
            crop(self.cache, q - n_commit)
        self.length += n_commit
        if self.observer is not None:
            self.observer(ForwardRecord(tokens, pos, mask, logits, n_commit, self.cache, self.rows))
        return logits

    def _build(self, n_commit: int, q: int, width: int | None) -> None:
        device = self.pad.device
        pos = (self.length + torch.arange(width or q, device=device))[None] - self.pad[:, None]
        mask = inference_mask(self.pad, self.length, n_commit, q - n_commit)
        if self.static_widths:  # the whole cache is visible in shape; unwritten entries are hidden
            full = torch.zeros((mask.shape[0], 1, width or q, self.capacity), dtype=torch.bool, device=device)
            full[:, :, :q, : self.length + q] = mask
            dead = torch.arange(q, width or q, device=device)
            full[:, :, dead, self.length + dead] = True  # a dead token sees itself only
            mask = full
            self._writes = self.length + torch.arange(width or q, device=device)
        self._pos, self._mask = pos.clamp_min(0), mask

    def drop(self, n: int) -> None:
        """Take the last `n` committed tokens out of the cache again (a rejected draft)."""
        crop(self.cache, n)
        self.length -= n
        self._key = None

    def keep(self, live: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """Drop finished rows from the cache and from every per-row tensor given."""
        idx = live.nonzero().squeeze(1)
        select_rows(self.cache, idx)
        self.pad, self.rows, self._key = self.pad[idx], self.rows[idx], None
        self.index = [self.index[i] for i in idx.tolist()]
        return [t[idx] for t in tensors]


class FinishedRows:
    """Finished rows, filled in as each row stops."""

    def __init__(self, n: int, tokenizer, stop: Sequence[str]):
        self.ids: list[list[int] | None] = [None] * n
        self.steps: list[list[int] | None] = [None] * n
        self.nfe = [0] * n
        self.tokenizer = tokenizer
        self.stop = list(stop)

    def finish(self, row: int, ids: list[int], steps: list[int], nfe: int) -> None:
        self.ids[row], self.steps[row], self.nfe[row] = ids, steps, nfe

    def stop_length(self, ids: list[int], checked: int) -> int | None:
        """Shortest n > checked such that the text of ids[:n] contains a stop string, if any."""
        if not self.stop or self.tokenizer is None:
            return None
        for n in range(checked + 1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:n], skip_special_tokens=True)
            if any(s in text for s in self.stop):
                return n
        return None

    def texts(self) -> list[str]:
        if self.tokenizer is None:
            return [""] * len(self.ids)
        texts = []
        for ids in self.ids:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            cut = [text.index(s) for s in self.stop if s in text]
            texts.append(text[: min(cut)] if cut else text)
        return texts


def _check_finite(values: torch.Tensor) -> None:
    if not math.isfinite(values.sum()):  # NaN and ±inf both survive a sum
        raise SBDError("the model returned NaN or infinite logits; decoding stopped (check the weights and dtype)")


def eos_test(eos: torch.Tensor):
    """A function telling which tokens are EOS: one comparison for the usual single EOS id."""
    if eos.numel() == 1:
        eos_id = int(eos)
        return lambda tokens: tokens == eos_id
    if eos.numel() == 0:
        return lambda tokens: torch.zeros_like(tokens, dtype=torch.bool)
    return lambda tokens: torch.isin(tokens, eos)


def ntp_decode(rows: LiveRows, ids: torch.Tensor, out: FinishedRows, eos: torch.Tensor, max_new: int,
               temperature: float, gen) -> None:
    """Plain next-token decoding: prefill all but the last prompt token, then one token per forward."""
    if ids.shape[1] > 1:
        rows.forward(ids[:, :-1], n_commit=ids.shape[1] - 1, n_logits=1)
    last = ids[:, -1:]
    made = torch.empty((ids.shape[0], max_new), dtype=torch.long, device=ids.device)
    checked = [0] * ids.shape[0]  # tokens already searched for stop strings, by original row
    is_eos = eos_test(eos)
    for t in range(max_new):
        logits = rows.forward(last, n_commit=1, n_logits=1)[:, -1]
        tok = pick_tokens(logits, temperature, gen)
        made[:, t] = tok
        done = is_eos(tok) if t + 1 < max_new else torch.ones_like(tok, dtype=torch.bool)
        # The one host synchronisation of a forward: finite logits, and whether a row stopped.
        finite, any_done = torch.stack([logits.amax(-1).sum(), done.any()]).tolist()
        if not math.isfinite(finite):
            _check_finite(logits.amax(-1))  # raises
        ended = {}
        if out.stop:
            for i, r in enumerate(rows.index):
                n = out.stop_length(made[i, : t + 1].tolist(), checked[r])
                checked[r] = t + 1
                if n is not None:
                    ended[i] = n
        if any_done or ended:
            for i in done.nonzero().squeeze(1).tolist():
                ended.setdefault(i, t + 1)
            for i, n in ended.items():
                out.finish(rows.index[i], made[i, :n].tolist(), list(range(1, n + 1)), t + 1)
            live = torch.ones_like(done)
            live[list(ended)] = False
            if not live.any():
                return
            made, tok = rows.keep(live, made, tok)
        last = tok[:, None]


def sbd_decode(rows: LiveRows, ids: torch.Tensor, out: FinishedRows, eos: torch.Tensor, max_new: int,
               block_size: int, gamma: float, proxy: str, mask_id: int, temperature: float, gen,
               fixed: int | None = None) -> None:
    """Set Block Decoding: each block starts as masks and is revealed by the EB rule; a finished
    block is committed in the first forward of the next one (docs/method.md §3). fixed: reveal the
    first `fixed` masked positions per forward instead (a timing schedule, not a decoding rule)."""
    any_order = math.isinf(gamma) or fixed is not None  # no entropies needed
    rows.forward(ids, n_commit=ids.shape[1], n_logits=1)
    b = ids.shape[0]
    made = torch.empty((b, max_new), dtype=torch.long, device=ids.device)
    steps = torch.zeros((b, max_new), dtype=torch.long, device=ids.device)
    nfe = torch.zeros(b, dtype=torch.long, device=ids.device)
    pending = ids[:, :0]
    produced = 0
    is_eos = eos_test(eos)
    checked = [0] * b
    while True:
        k = min(block_size, max_new - produced)
        block = torch.full((pending.shape[0], k), mask_id, dtype=torch.long, device=ids.device)
        masked = torch.ones_like(block, dtype=torch.bool)
        when = torch.zeros_like(block)
        live = torch.ones(block.shape[0], dtype=torch.bool, device=ids.device)
        inputs, n_commit = torch.cat([pending, block], dim=1), pending.shape[1]
        stopped = 0  # rows of this block that stopped (host count: no sync to ask)
        while True:
            logits = rows.forward(inputs, n_commit=n_commit, n_logits=k)
            n_commit = 0
            logits[..., mask_id] = torch.finfo(logits.dtype).min  # never reveal the mask token itself
            if any_order:  # γ = ∞ reveals every masked position, a fixed schedule the first few
                h, picked = logits.amax(-1), pick_tokens(logits, temperature, gen)
            elif temperature > 0:
                h, picked = error_proxy(logits, "entropy"), pick_tokens(logits, temperature, gen)
            else:
                h, picked = entropy_and_argmax(logits)  # the EB bound is on entropies whatever the proxy
            order = None if proxy == "entropy" or any_order else error_proxy(logits, proxy)
            # Positions after the first EOS that the block holds (revealed) or predicts (masked) are not
            # revealed: if that EOS stands they are discarded, so a forward spent on them is wasted.
            ends = is_eos(torch.where(masked, picked, block))
            todo = masked & (ends.cumsum(-1) <= ends)  # no EOS strictly before the position
            if fixed is not None:
                reveal = todo & (todo.cumsum(-1) <= fixed)
            else:
                reveal = todo if math.isinf(gamma) else reveal_from_proxy(h, todo, gamma, order)
            block = torch.where(reveal, picked, block)
            masked = masked ^ reveal  # reveal ⊆ masked
            nfe += todo.any(-1)  # rows whose block is already revealed (or that stopped) ride along uncounted
            when = torch.where(reveal, nfe[:, None], when)
            is_eos_revealed = ends & ~masked  # (a stopped row's block holds masks again: never counted twice)
            # The one host synchronisation of a forward: finite logits, an EOS revealed, any mask left.
            finite, eos_seen, left = torch.stack([h.sum(), is_eos_revealed.any(), masked.any()]).tolist()
            if not math.isfinite(finite):
                _check_finite(h)  # raises
            ended = {}
            if eos_seen or out.stop:  # rare or opt-in: the common forward skips this bookkeeping
                known = (~masked).cumprod(-1).bool()  # revealed with every earlier position revealed
            if eos_seen:
                hit = (is_eos_revealed & known).any(-1)
                ended = {i: produced + int(is_eos_revealed[i].nonzero()[0]) + 1
                         for i in hit.nonzero().squeeze(1).tolist()}
            if out.stop:
                for i in live.nonzero().squeeze(1).tolist():
                    r = rows.index[i]
                    upto = produced + int(known[i].sum())
                    seq = torch.cat([made[i, :produced], block[i]]).tolist()[:upto]
                    n = out.stop_length(seq, checked[r])
                    checked[r] = upto
                    if n is not None and (i not in ended or n < ended[i]):
                        ended[i] = n
            for i, n in ended.items():
                seq = torch.cat([made[i, :produced], block[i]])[:n].tolist()
                st = torch.cat([steps[i, :produced], when[i]])[:n].tolist()
                out.finish(rows.index[i], seq, st, int(nfe[i]))
                live[i] = False
                stopped += 1
                masked[i], block[i] = False, mask_id  # a stopped row reveals nothing and holds no EOS
            if ended:
                left = bool(masked.any())
            if not left:
                break
            inputs = block
        made[:, produced : produced + k] = block
        steps[:, produced : produced + k] = when
        produced += k
        if produced >= max_new:
            for i in live.nonzero().squeeze(1).tolist():
                out.finish(rows.index[i], made[i].tolist(), steps[i].tolist(), int(nfe[i]))
            return
        if stopped:
            if stopped == len(rows.index):
                return
            made, steps, nfe, block = rows.keep(live, made, steps, nfe, block)
        pending = block
