"""The sampler head's chain (`HeadChain`, a `Drafter`): each place re-ranked among the masks' top candidates
given the token chosen before it. The device builds a table (`draft_table`, through the verifying forward's
`Drafting`); the host walks it (`walk`). The head itself (module, config, weights, training forward) is
`sbd.drafters.sampler_head`; its decoding lives here, beside the other drafters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ...drafters.sampler_head import SamplerHead
from .base import Seen


@dataclass
class Drafting:
    """What a verifying row needs to draft with the head: the head, the model (its tables) and the final
    hidden states at the row's logit positions, aligned with its logits."""

    head: SamplerHead
    model: object
    hidden: torch.Tensor  # (n_logits, H)

    def table(self, logits: torch.Tensor, at: int, first: torch.Tensor, probs: bool = False) -> torch.Tensor:
        """`draft_table` for the draft positions whose logits are `logits` (m, V), the row's logit
        positions at, at + 1, …; `first`: the token before the first of them (a 0-d device tensor)."""
        m = logits.shape[0]
        return draft_table(self.head, self.model, self.hidden[at : at + m], logits, first, probs)


def draft_table(head: SamplerHead, model, hidden: torch.Tensor, logits: torch.Tensor,
                first: torch.Tensor, probs: bool = False) -> torch.Tensor:
    """Greedy head drafts for m positions, as a table the host walks (`walk`): (2·m·K,) values, first the
    masks' top-K candidates (m, K) by their own logits, then best (m, K): best[i, j] is the rank of the
    candidate the head picks at position i when position i − 1 holds candidate j (row 0: when it holds
    `first`; all its columns are equal). probs: then also (m, K) more: the head's probability of that
    pick (its softmax over the K candidates), which adaptive drafting reads as the chance that the
    token stands (on SmolLM2 a pick of 0.9 stood 91% of the time, one of 0.3 25%).

    A candidate c scores logits[i, c] + delta_i · W_out[c], which is lm_head(h'_i)[c] for a linear
    output layer: so a zero `down` keeps the masks' own order exactly."""
    m, vocab = logits.shape
    k = min(head.config.top_k, vocab)
    cand = logits.topk(k, dim=-1).indices                                    # (m, K), best first
    base = logits.gather(-1, cand).float()                                   # (m, K)
    table = model.get_input_embeddings().weight
    prev = torch.cat([first.reshape(1, 1).expand(1, k), cand[:-1]])          # (m, K) token before position i
    h = hidden.to(head.up.weight.dtype)
    w1h, w1e = head.up.weight[:, : h.shape[-1]], head.up.weight[:, h.shape[-1]:]
    # the model's tables may be in another dtype than the head (vLLM serves bfloat16 weights by default)
    pre = F.linear(h, w1h, head.up.bias)[:, None] + F.linear(F.embedding(prev, table).to(h.dtype), w1e)  # (m, K, width)
    out = model.get_output_embeddings()  # a quantized output layer gives its rows dequantized (`rows`)
    out_w = (out.rows(cand) if hasattr(out, "rows") else out.weight[cand]).float()  # (m, K, H) candidate rows
    if head.carry is None:
        delta = F.linear(F.silu(pre), head.down.weight)                      # (m, K, H) for each previous j
        scores = base[:, None, :] + torch.einsum("mjh,mch->mjc", delta.float(), out_w)  # (m, K_prev, K)
    else:
        scores = _state_scores(head, pre, base, out_w)
    if not probs:
        return torch.cat([cand.flatten(), scores.argmax(-1).flatten()])
    return torch.cat([cand.flatten().double(), scores.argmax(-1).flatten().double(),
                      scores.softmax(-1).amax(-1).flatten().double()])


def _state_scores(head: SamplerHead, pre: torch.Tensor, base: torch.Tensor, out_w: torch.Tensor) -> torch.Tensor:
    """A state head's scores (m, K_prev, K), position by position along its greedy chain: row i reads the
    activation the chain left at i − 1 (zero before the first). Indices stay on the device (no sync)."""
    rows, state, j = [], None, torch.zeros((), dtype=torch.long, device=pre.device)  # row 0: any column
    for i in range(pre.shape[0]):
        a = F.silu(pre[i] if state is None else pre[i] + F.linear(state, head.carry.weight))  # (K_prev, width)
        row = base[i][None] + F.linear(a, head.down.weight).float() @ out_w[i].T                # (K_prev, K)
        rows.append(row)
        state, j = a[j], row[j].argmax()  # the chain's activation here, and its pick (the next row's column)
    return torch.stack(rows)


def walk(values, m: int, probs: bool = False):
    """The head's greedy chain from a `draft_table` read on the host (m positions); with probs (a table
    made with probs=True), (chain, the head's probability of each of its tokens)."""
    if m == 0:
        return ([], []) if probs else []
    k = len(values) // ((3 if probs else 2) * m)
    cand, best, p = values[: m * k], values[m * k : 2 * m * k], values[2 * m * k :]
    out, picked, prev = [], [], 0
    for i in range(m):
        j = int(best[i * k + prev])  # row 0: every column holds the same pick
        out.append(int(cand[i * k + j]))
        if probs:
            picked.append(float(p[i * k + prev]))
        prev = j
    return (out, picked) if probs else out


class HeadChain:
    """One row's or request's chain of the sampler head (a `Drafter`, drafting from the masks like
    `MaskChain`, hence its source): `values` builds the head's table on the device from `seen.drafting` (a
    `Drafting`), `propose` walks it on the host. cut: send each pick's probability too, for a chain cut where
    the head is unsure (`DraftPolicy.confident`); they are in `probs` after `propose`."""

    source = "masks"

    def __init__(self):
        self.m = 0  # tokens in the last chain asked for
        self.width = 0  # values the last table took
        self.cut = False
        self.sends_probs = False
        self.probs: list[float] | None = None

    def values(self, seen: Seen) -> list[torch.Tensor]:
        """The table for the places whose masks' logits are `seen.masks` (m, V), at the row's logit positions
        seen.at, seen.at + 1, …, after the token `seen.first`."""
        self.m = seen.masks.shape[0]
        self.sends_probs = self.cut and self.m > 0
        if self.m == 0:
            self.width = 0
            return []
        table = seen.drafting.table(seen.masks, seen.at, seen.first, probs=self.sends_probs).double()
        self.width = table.numel()
        return [table]

    def propose(self, values: Sequence[float], seen: Seen | None = None) -> list[int]:
        """The chain the table encodes (it leads `values`); each token's probability, when sent, to `probs`."""
        self.probs = None
        if not self.sends_probs:
            return walk(values[: self.width], self.m)
        chain, self.probs = walk(values[: self.width], self.m, probs=True)
        return chain
