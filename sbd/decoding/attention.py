"""How a decoding forward attends: blocks at a token's price, without a dense mask or copied KV heads.

Hugging Face's SDPA path is given a dense (B, 1, W, S) mask for every block forward; then it copies
each key/value head once per query head that shares it (`repeat_kv`) and runs a masked kernel. On a GPU
with a long cache that copy is most of the forward: an H200 ran a 2-token block at batch 16 with 16k
cached tokens in 6.5 one-token steps (../shared/gpu/h200-2026-11-26/). The engine instead describes
each forward by its layout (`StepLayout`: per-row cache lengths, tokens fed, committed tokens) and
routes the model's attention here (the attention function "sbd", registered with transformers), which
picks the cheapest exact plan:

- "open": every row has the same cache length and feeds a real token in every column, and the forward
  needs no mask at all: one token per row, or one block of masks that sees everything. One kernel
  call, key/value heads shared natively (`enable_gqa`).
- "split": the same uniform layout with committed tokens before the block. The committed rows attend
  causally (lower-right aligned) to the cache and to each other; the block rows see everything before
  them and the whole block (or, with causal blocks, the tokens up to themselves). On CUDA two flash
  kernel calls and no mask tensor; elsewhere one call under a (1, 1, W, S) mask shared by all rows and
  layers (SDPA's own `is_causal` aligns upper-left, and a CPU pays more for a second call than a mask).
- "rows": rows at different lengths, padding, trees, or fixed shapes (a compiled step sees the whole
  cache). One per-row mask, built once per forward and shared by every layer, with the key/value heads
  shared: natively on the CPU (its flash kernel takes a mask with `enable_gqa`), by folding each
  head's group of queries into the query length on CUDA (whose masked kernels do not share heads).

- "exact": for a model whose linear layers are row-invariant (quantized weights, `sbd.models.quantized`):
  each row alone, its committed tokens one at a time, each through the very call a one-token forward at
  that position makes (same kernel, same keys), a prefill's prompt in one causal call as it runs alone,
  its block in one call. A verifying forward's committed positions are then bit for bit NTP's one-token
  forwards, alone or in any batch, so sbd-verify gives NTP's tokens even where two tokens nearly tie. It
  costs a kernel call per committed token and layer (short on a CPU at batch 1, where drafts are short).

Every plan computes the attention the dense mask describes (tests compare them: `tests/test_attention.py`).

On a CPU, sbd's engine forward (`sbd.decoding.llama_forward`) runs the "exact" and "open" plans of float32
models on sbd's own kernel (`attend_rows`, sbd/native/attention.h) where its compiled extension is loaded
(`sbd.decoding.own_kernels`): each query row over the keys it sees, alone, in a fixed order. It takes ~11 µs
where torch's takes ~19 (one SmolLM2 token over 257 keys, called from Python) and, being row-invariant, serves
a whole verifying forward in one call: its committed rows are bit for bit those of one-token forwards, as the
"exact" plan requires.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "sbd"  # the attention implementation's name in transformers' registry
PLANS = ("open", "split", "rows", "exact")
OWN_PLANS = ("open", "exact")  # the plans sbd's own kernel runs (the others take masks)


@dataclass
class StepLayout:
    """One forward's attention, per row (the engine's `step_mask` describes the same thing densely).

    plan: "open", "split", "rows" or "exact" (module docstring). length/n_commit/width (host ints): the
    uniform plans' cache length, committed tokens and tokens fed per row. causal_blocks: block tokens see only
    the block tokens up to themselves. mask: the "rows" plan's (B, 1, W, S) bool mask (True = may attend),
    or its (B, 1, g·W, S) additive form with each head's g queries folded in (`fold`). rows: the "exact"
    plan's (cache length, tokens fed, committed, prefill) per row (host ints; columns right-aligned)."""

    plan: str
    length: int = 0
    n_commit: int = 0
    width: int = 0
    causal_blocks: bool = False
    mask: torch.Tensor | None = None
    fold: int = 1
    flash: bool = False  # causal parts through CUDA's flash kernel, lower-right (`flash_causal`)
    rows: list | None = None


def supports(model) -> bool:
    """The engine may route this model's attention through "sbd": a transformers model on SDPA attention
    whose forward passes extra keywords down to its attention (eager attention, wrappers with a fixed
    signature and scripted test models keep the dense mask they honour)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(config, "get_text_config"):
        return False
    params = inspect.signature(model.forward).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def head_groups(model) -> int:
    """Query heads per key/value head (1 without grouped-query attention)."""
    text = model.config.get_text_config(decoder=True)
    return text.num_attention_heads // (getattr(text, "num_key_value_heads", None) or text.num_attention_heads)


def head_size(model) -> int:
    """The size of one attention head (its config's head_dim, else hidden size over query heads)."""
    text = model.config.get_text_config(decoder=True)
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def flash_causal(model) -> bool:
    """Whether causal parts may run CUDA's flash kernel directly (it aligns `is_causal` lower-right and
    shares key/value heads natively): CUDA, half precision, head size a multiple of 8 up to 256, and a GPU
    of compute capability 8.0 or later. Decided once per engine, outside any compiled graph."""
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cuda" or weight.dtype not in (torch.float16, torch.bfloat16):
        return False
    head = head_size(model)
    return head % 8 == 0 and head <= 256 and torch.cuda.get_device_capability(weight.device) >= (8, 0)


def uniform_plan(length: int, n_commit: int, width: int, causal_blocks: bool, flash: bool = False,
                 device=None) -> StepLayout:
    """The plan for rows that share one cache length and feed `width` real tokens, the first `n_commit`
    committed: "open" when nothing needs a mask, else "split". Without the flash kernel (CPU, float32)
    the split plan's two parts run as one kernel call over one (1, 1, W, S) mask shared by every row and
    layer, built here once per forward (`device`: where it goes): on a CPU two calls cost more than a mask."""
    if n_commit > width or width < 1 or length < 0:
        raise ValueError(f"impossible uniform layout: {n_commit} committed of {width} over {length} cached")
    open_ = width == 1 or (n_commit == 0 and not causal_blocks)
    layout = StepLayout("open" if open_ else "split", length, n_commit, width, causal_blocks, flash=flash)
    if not open_ and not flash:
        q = torch.arange(width, device=device)[:, None]
        kv = torch.arange(length + width, device=device)[None] - length  # < 0: the cache
        sees = kv <= q if causal_blocks else (kv <= q) | (q >= n_commit)
        layout.mask = sees[None, None]
    return layout


def exact_plan(rows: list[tuple[int, int, int, bool]], width: int, causal_blocks: bool) -> StepLayout:
    """The "exact" plan: per row (cache length, tokens fed, committed tokens, prefill)."""
    return StepLayout("exact", width=width, causal_blocks=causal_blocks, rows=rows)


def rows_plan(mask: torch.Tensor, fold: int, dtype: torch.dtype) -> StepLayout:
    """The plan for a per-row bool mask (B, 1, W, S). fold > 1 (CUDA with grouped-query attention):
    the mask is laid out for queries folded by head group, additive in `dtype`, once for all layers."""
    if fold > 1:
        b, _, w, s = mask.shape
        folded = mask[:, :, None].expand(b, 1, fold, w, s).reshape(b, 1, fold * w, s)
        additive = torch.zeros(folded.shape, dtype=dtype, device=mask.device)
        additive.masked_fill_(~folded, torch.finfo(dtype).min)
        return StepLayout("rows", mask=additive, fold=fold)
    return StepLayout("rows", mask=mask, fold=1)


def query_ends(layout: StepLayout, batch: int, width: int) -> torch.Tensor | None:
    """(batch, width) int64: how many keys each query of an "open" or "exact" forward sees (0 for padding
    columns), as sbd's kernel takes them; None for the other plans."""
    if layout.plan == "open":
        return torch.full((batch, width), layout.length + layout.width, dtype=torch.long)
    if layout.plan != "exact":
        return None
    ends = []
    for length, n, c, _ in layout.rows:
        block = [length + t + 1 if t < c or layout.causal_blocks else length + n for t in range(n)]
        ends.append([0] * (width - n) + block)
    return torch.tensor(ends, dtype=torch.long)


def fold_for(device: torch.device, groups: int) -> int:
    """How far the "rows" plan folds queries: by the head group on CUDA, not at all elsewhere."""
    return groups if device.type == "cuda" and groups > 1 else 1


def _sdpa(q, k, v, scale, mask=None):
    gqa = q.shape[1] != k.shape[1]
    if gqa and mask is None and q.shape[2] == 1 and q.device.type == "cpu":
        return _folded(q, k, v, scale)  # one query (a token NTP decodes, a committed token of sbd-verify)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def _folded(q, k, v, scale):
    """Queries that all see every key (a block, or one query): each key/value head's group of query heads
    folded into the query length, one kernel call without head sharing. On a CPU a few queries per head run
    1.5x faster so than with `enable_gqa` (2-3 block queries over 220 keys, SmolLM2's heads: 21-26 against
    31-41 µs); one query 1.0x at 100 keys, 1.45x at 300, 1.7x at 1000 (15/23/49 µs against 15/33/83 on a
    2-core Xeon): SmolLM2 int4 decodes 4-6% faster. The rounding differs from `enable_gqa`'s, so every
    one-query attention takes this path (`_sdpa`): a committed token of sbd-verify is computed as NTP
    computes it. Only drafts read a block's outputs: the tokens of sbd-verify do not depend on its rounding."""
    b, h, w, d = q.shape
    groups = h // k.shape[1]
    if groups == 1 or q.device.type != "cpu":
        return _sdpa(q, k, v, scale)
    folded = q.reshape(b, k.shape[1], groups * w, d)  # head i = key/value head i // groups, copy i % groups
    return F.scaled_dot_product_attention(folded, k, v, scale=scale).view(b, h, w, d)


def _lower_right(q, k, v, scale, flash: bool):
    """Causal attention of the q.shape[2] last positions over all k.shape[2] keys (query i sees keys up to
    S − Q + i). CUDA's flash kernel aligns `is_causal` lower-right and shares heads natively (`flash`);
    SDPA's `is_causal` aligns upper-left, so elsewhere a small (Q, S) mask says it."""
    nq, s = q.shape[2], k.shape[2]
    if flash and nq > 1:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)[0]
    if nq == 1:
        return _sdpa(q, k, v, scale)
    mask = torch.ones(nq, s, dtype=torch.bool, device=q.device).tril(s - nq)
    return _sdpa(q, k, v, scale, mask)


def _exact(q, k, v, layout: StepLayout, scale) -> torch.Tensor:
    """The "exact" plan: every row alone; a committed token through the call a one-token forward at its
    position makes (one query over the keys up to itself), a prefill's prompt in one causal call, the block
    in one call. Padding columns attend to nothing and give zeros (nobody reads them)."""
    width = q.shape[2]
    if len(layout.rows) == 1 and width == 1 and layout.rows[0][1:3] == (1, 1):  # one row's one token: its own call
        return _sdpa(q, k[:, :, : layout.rows[0][0] + 1], v[:, :, : layout.rows[0][0] + 1], scale)
    out = torch.zeros_like(q)
    for b, (length, n, c, prefill) in enumerate(layout.rows):
        first = width - n
        qb, kb, vb = q[b : b + 1], k[b : b + 1], v[b : b + 1]
        if prefill and c:
            end = length + c
            out[b : b + 1, :, first : first + c] = _lower_right(qb[:, :, first : first + c], kb[:, :, :end],
                                                                vb[:, :, :end], scale, False)
        else:
            for t in range(c):
                end = length + t + 1
                col = first + t
                out[b : b + 1, :, col : col + 1] = _sdpa(qb[:, :, col : col + 1], kb[:, :, :end], vb[:, :, :end], scale)
        if c < n:
            end = length + n
            block = qb[:, :, first + c :]
            out[b : b + 1, :, first + c :] = (_lower_right(block, kb[:, :, :end], vb[:, :, :end], scale, False)
                                              if layout.causal_blocks else _folded(block, kb[:, :, :end], vb[:, :, :end], scale))
    return out


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: StepLayout, scale: float | None,
           own=None, ends: torch.Tensor | None = None) -> torch.Tensor:
    """Attention output (B, H, W, D) of queries (B, H, W, D) over keys/values (B, Hkv, S, D) per `layout`; on
    sbd's kernel (`own`, the extension) when `ends` (`query_ends`) is given."""
    if ends is not None:
        return own.attend_rows(q, k, v, ends, q.shape[-1] ** -0.5 if scale is None else scale)
    if layout.plan == "exact":
        return _exact(q, k, v, layout, scale)
    if layout.plan == "rows":
        if layout.fold == 1:
            return _sdpa(q, k, v, scale, layout.mask)
        b, h, w, d = q.shape
        folded = q.reshape(b, k.shape[1], layout.fold * w, d)  # head h = kv head h // g, copy h % g
        return F.scaled_dot_product_attention(folded, k, v, attn_mask=layout.mask, scale=scale).reshape(b, h, w, d)
    end = layout.length + layout.width
    if k.shape[2] < end:
        raise ValueError(f"the cache holds {k.shape[2]} positions, the layout needs {end}")
    k, v = k[:, :, :end], v[:, :, :end]
    if layout.plan == "open":
        return _sdpa(q, k, v, scale)
    if layout.mask is not None:  # both parts at once, under the shared (1, 1, W, S) mask
        return _sdpa(q, k, v, scale, layout.mask)
    c = layout.n_commit
    if layout.causal_blocks:  # every fed token sees the tokens up to itself
        return _lower_right(q, k, v, scale, layout.flash)
    parts = []
    if c:
        end_c = layout.length + c
        parts.append(_lower_right(q[:, :, :c], k[:, :, :end_c], v[:, :, :end_c], scale, layout.flash))
    if c < layout.width:
        parts.append(_sdpa(q[:, :, c:], k, v, scale))
    return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]


def sbd_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                  sbd_layout: StepLayout | None = None, **kwargs):
    """transformers' attention-function contract: returns (B, W, H, D) and no weights."""
    if sbd_layout is None:
        raise RuntimeError("the 'sbd' attention runs only inside sbd's decoding engine (it needs the step's layout)")
    return attend(query, key, value, sbd_layout, scaling).transpose(1, 2).contiguous(), None


_REGISTERED = False


def register() -> None:
    """Make "sbd" a transformers attention implementation (once per process). It has no mask function,
    so transformers builds no mask for it: the engine passes the layout instead."""
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, sbd_attention)
        _REGISTERED = True


@contextlib.contextmanager
def routed(model, on: bool = True):
    """The model's attention goes through "sbd" inside the block (and back to what it was after)."""
    if not on:
        yield
        return
    register()
    before = model.config._attn_implementation
    model.config._attn_implementation = NAME
    try:
        yield
    finally:
        model.config._attn_implementation = before
