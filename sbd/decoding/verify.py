"""Lossless self-speculative SBD (`method="sbd-verify"`): the masked head drafts, the next-token head checks.

An SBD model has both heads in one set of weights. Every forward feeds

    [ head | draft | masks ]
      head   the one verified token not yet in the cache (causal, committed)
      draft  the masked head's guesses for the positions after it (causal, committed)
      masks  `block_size` mask tokens after the draft (bidirectional scratch, dropped after the call)

The causal part gives the model's next-token (NTP) prediction after the head and after every draft
token, so the draft is checked in the same forward that commits it: the longest prefix of the draft
that NTP decoding would itself have produced is kept, followed by NTP's own next token (the correction
at the first mismatch, or a bonus token when the whole draft stood). The rest of the draft leaves the
cache again. When the whole draft stood, the masks' predictions were made in the right context and
become the next draft (the first mask sits where the new head token goes, so the next draft starts one
position later); otherwise the next forward drafts afresh. Every forward therefore yields at least one
token, and the output is exactly NTP's: greedy, the same tokens; sampling, the same distribution
through the speculative acceptance rule (accept a draft token x with probability min(1, p(x)/q(x)),
else draw from the normalised max(0, p − q)), p the NTP and q the masked distribution.

Rows of a batch keep a common cache length, so a forward keeps the shortest accepted prefix over the
live rows; every row's tokens stay exact, only the speed of the faster rows is given up.
"""

from __future__ import annotations

import math

import torch

from ..sampler import entropy_and_argmax, error_proxy, reveal_from_proxy
from .loops import FinishedRows, LiveRows, _check_finite, eos_test


def _accept_greedy(ntp_logits: torch.Tensor, draft: torch.Tensor):
    """Accepted draft length per row and NTP's token after each position (B, L + 1)."""
    target = ntp_logits.argmax(-1)
    agree = (draft == target[:, : draft.shape[1]]).long()
    return agree.cumprod(-1).sum(-1), target


def _accept_sampled(ntp_logits, draft, q_draft, temperature, gen):
    """Speculative acceptance: accepted length per row and the token at each position if drawn there:
    the draft token where accepted, the residual sample at the first rejection, a sample of p after the
    last draft token."""
    b, n = draft.shape
    p = torch.softmax(ntp_logits.float() / temperature, dim=-1)  # (B, L + 1, V)
    tokens = torch.empty((b, n + 1), dtype=torch.long, device=draft.device)
    if n:
        p_d = p[:, :n].gather(-1, draft[..., None]).squeeze(-1)
        q_d = q_draft.gather(-1, draft[..., None]).squeeze(-1)
        u = torch.rand(p_d.shape, generator=gen, device=draft.device)
        ok = (u * q_d <= p_d).long()  # u < p/q without dividing by a zero q
        accepted = ok.cumprod(-1).sum(-1)
        residual = (p[:, :n] - q_draft).clamp_min(0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p[:, :n])
        fix = torch.multinomial(residual.reshape(b * n, -1), 1, generator=gen).view(b, n)
        tokens[:, :n] = torch.where(ok.cumprod(-1).bool(), draft, fix)
    else:
        accepted = torch.zeros(b, dtype=torch.long, device=draft.device)
    tokens[:, n] = torch.multinomial(p[:, n], 1, generator=gen).squeeze(-1)
    return accepted, tokens


def _eb_draft(rows: LiveRows, head: torch.Tensor, logits: torch.Tensor, mask_id: int, gamma: float, proxy: str):
    """Refine a draft with the EB rule before it is verified: the block [head, masks…] is revealed over
    further forwards (no commit), like an SBD block. Greedy only. Returns the draft and the forwards spent."""
    k = logits.shape[1]
    block = torch.cat([head, torch.full((head.shape[0], k - 1), mask_id, dtype=torch.long, device=head.device)], 1)
    masked = torch.ones_like(block, dtype=torch.bool)
    masked[:, 0] = False
    spent = 0
    while True:
        h, picked = entropy_and_argmax(logits)  # greedy: the same helper as the SBD loop
        order = None if proxy == "entropy" else error_proxy(logits, proxy)
        reveal = reveal_from_proxy(h, masked, gamma, order)
        block = torch.where(reveal, picked, block)
        masked &= ~reveal
        if not masked.any():
            return block[:, 1:], spent
        logits = rows.forward(block, n_commit=0, n_logits=k)
        logits[..., mask_id] = torch.finfo(logits.dtype).min
        spent += 1


def verify_decode(rows: LiveRows, ids: torch.Tensor, out: FinishedRows, eos: torch.Tensor, max_new: int,
                  block_size: int, mask_id: int, temperature: float, gen, eb_gamma: float | None = None,
                  proxy: str = "entropy") -> list[list[int]]:
    """Decode with masked drafts checked by the model's own NTP predictions; returns, per row, the
    number of draft tokens accepted at each verifying forward. eb_gamma None: each draft is the whole
    block from one forward; a number: the draft is revealed by the EB rule first (greedy only), which
    costs forwards of its own."""
    if ids.shape[1] > 1:
        rows.forward(ids[:, :-1], n_commit=ids.shape[1] - 1, n_logits=1)
    b, device = ids.shape[0], ids.device
    head = ids[:, -1:]
    draft = ids[:, :0]
    q_draft = None
    made = torch.empty((b, max_new + block_size + 1), dtype=torch.long, device=device)
    steps = torch.zeros_like(made)
    accepted_log: list[list[int]] = [[] for _ in range(b)]
    produced, nfe = 0, 0
    checked = [0] * b
    is_eos = eos_test(eos)
    positions = torch.arange(max_new + block_size + 1, device=device)
    while True:
        room = max(0, max_new - produced - 1)  # a forward yields at most n_draft + 1 tokens
        if draft.shape[1] > room:
            draft = draft[:, :room]
            q_draft = q_draft[:, :room] if q_draft is not None else None
        n_draft = draft.shape[1]
        masks = torch.full((head.shape[0], block_size), mask_id, dtype=torch.long, device=device)
        logits = rows.forward(torch.cat([head, draft, masks], dim=1), n_commit=1 + n_draft,
                              n_logits=1 + n_draft + block_size)
        nfe += 1
        ntp_logits, mask_logits = logits[:, : 1 + n_draft], logits[:, 1 + n_draft:]
        if temperature > 0:
            per_row, tokens = _accept_sampled(ntp_logits, draft, q_draft, temperature, gen)
        else:
            per_row, tokens = _accept_greedy(ntp_logits, draft)
        shortest = per_row.min()  # common cache length: the shortest accepted prefix over the rows
        hit = is_eos(tokens) & (positions[: 1 + n_draft] <= shortest)  # EOS among the tokens kept
        # The one host synchronisation of a forward: finite logits, tokens kept, an EOS among them.
        finite, a, eos_seen = torch.stack([ntp_logits.amax(-1).sum(), shortest, hit.any()]).tolist()
        if not math.isfinite(finite):
            _check_finite(ntp_logits.amax(-1))  # raises
        a = int(a)
        for r in rows.index:
            accepted_log[r].append(a)
        if a < n_draft:
            rows.drop(n_draft - a)  # the rejected draft leaves the cache
        new = tokens[:, : a + 1]  # draft tokens kept (they equal NTP's) + NTP's next token
        made[:, produced: produced + a + 1] = new
        steps[:, produced: produced + a + 1] = nfe
        start, produced = produced, produced + a + 1

        ended = {}
        if eos_seen:
            for i in hit.any(-1).nonzero().squeeze(1).tolist():
                ended[i] = start + int(hit[i].nonzero()[0]) + 1
        if out.stop:
            for i, r in enumerate(rows.index):
                n = out.stop_length(made[i, :produced].tolist(), checked[r])
                checked[r] = produced
                if n is not None and (i not in ended or n < ended[i]):
                    ended[i] = n
        if produced >= max_new:
            for i in range(head.shape[0]):
                ended[i] = min(ended.get(i, max_new), max_new)
        for i, n in ended.items():
            out.finish(rows.index[i], made[i, :n].tolist(), steps[i, :n].tolist(), nfe)
        head = new[:, -1:]
        if ended:  # finished rows leave before the next draft is made
            live = torch.ones(head.shape[0], dtype=torch.bool, device=device)
            live[list(ended)] = False
            if not live.any():
                return accepted_log
            made, steps, head, mask_logits = rows.keep(live, made, steps, head, mask_logits)
        mask_logits[..., mask_id] = torch.finfo(mask_logits.dtype).min  # never draft the mask token (in place)
        q_draft = None
        if a < n_draft:  # the masks rode on a rejected draft: the next forward drafts afresh
            draft = head[:, :0]
        elif eb_gamma is not None and block_size > 1:
            draft, spent = _eb_draft(rows, head, mask_logits, mask_id, eb_gamma, proxy)
            nfe += spent
        elif temperature > 0:  # positions 2.. of the masks are the next draft (1 is the new head token)
            q_draft = torch.softmax(mask_logits[:, 1:].float() / temperature, dim=-1)
            flat = q_draft.reshape(-1, q_draft.shape[-1])
            draft = torch.multinomial(flat, 1, generator=gen).view(q_draft.shape[:2])
        else:
            draft = mask_logits[:, 1:].argmax(-1)
