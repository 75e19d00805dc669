"""The gated update, written once: `out + g · scale · (x Aᵀ) Bᵀ`, with the gate g 1 at the gated rows
(block / mask positions) and 0 at every other row, whose output stays the frozen model's own.

Hugging Face forwards (the adapter's layer hooks) and vLLM's compiled graph (`integrations/vllm/gate.py`)
describe the gated rows differently, so the gate comes in four forms; each keeps the arithmetic its
caller has always had (token-identical outputs), the low-rank product itself is `low_rank` for all.
"""

from __future__ import annotations

import torch


def low_rank(x: torch.Tensor, a_t: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """(x Aᵀ) Bᵀ: x (..., in), a_t (in, r), b_t (r, out), in x's dtype."""
    return (x @ a_t.to(x.dtype)) @ b_t.to(x.dtype)


def gated_update(out: torch.Tensor, x: torch.Tensor, a_t: torch.Tensor, b_t: torch.Tensor, scale: float = 1.0, *,
                 start: int | None = None, per_row: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                 column: torch.Tensor | None = None) -> torch.Tensor:
    """`out` (the layer's output for input `x`) plus the gated update; exactly one gate form:

    - start: rows at or after `start` along dim -2 in every sequence (an SBD forward puts its block last);
      out (B, q, out). Decoding (no grad, matching dtypes) adds in place, one fused multiply-add.
    - per_row: (B, q, 1) the gate itself, 0 or 1 at each position of each sequence (the sequences of a
      batch at different stages).
    - rows: (m,) indices along dim 0 of a flat out (N, out); the update, computed in a_t's dtype, is added
      in place there.
    - column: (N, 1) the gate times `scale` per row (`scale` unused); rows where it is 0 keep `out` bit
      for bit (a branch-free form a CUDA graph can capture).

    Returns the updated output (`out` itself where it was updated in place)."""
    if column is not None:
        return torch.where(column != 0, out + low_rank(x, a_t, b_t) * column, out)
    if rows is not None:
        delta = low_rank(x.index_select(0, rows).to(a_t.dtype), a_t, b_t)
        return out.index_add_(0, rows, delta.to(out.dtype), alpha=scale)
    if per_row is not None:
        return out + low_rank(x, a_t, b_t) * scale * per_row
    if start >= out.shape[-2]:
        return out
    if not torch.is_grad_enabled() and out.dim() == 3 and x.dtype == out.dtype == a_t.dtype:
        # decoding: one fused multiply-add into the block's rows, no copy of the whole output. A hook runs
        # on every targeted layer of every forward (210 on SmolLM2), so its few small products cost more in
        # dispatch than in arithmetic: one sequence is one 2-D addmm.
        if out.shape[0] == 1 and out.is_contiguous() and x.is_contiguous():
            block = out.view(-1, out.shape[-1])[start:]
            block.addmm_(torch.mm(x.view(-1, x.shape[-1])[start:], a_t), b_t, alpha=scale)
            return out
        block = out[:, start:, :]
        block.baddbmm_(x[:, start:, :] @ a_t, b_t.expand(out.shape[0], -1, -1), alpha=scale)
        return out
    if start == 0:
        return out + low_rank(x, a_t, b_t) * scale
    delta = low_rank(x[..., start:, :], a_t, b_t) * scale
    return torch.cat([out[..., :start, :], out[..., start:, :] + delta], dim=-2)

