"""The masks' chains the vLLM proposer drafts from: masks 2..k of a step's forward (kept by the model in its
stash) give the next step's draft, as sbd's rows take them (`sbd.decoding.proposers.chain`), or the sampler
head's walk over them when the drafter has one."""

from __future__ import annotations

import torch

from sbd.decoding.proposers import chain as mask_chain


@torch.inference_mode()
def mask_chains(model, head, stash, want: dict[int, int], sampled, req_ids, cut: bool):
    """({batch index: (chain, each token's drafting probability or None)}, whether the logits had to be
    projected again) for the requests in `want` (index -> masks of the next draft) whose step ran as drafted
    (the stash's segment is theirs and every draft token stood). cut: the chain will be cut by confidence
    (send the probabilities; a sampler head's chains are not)."""
    keep = []
    for i, req_id, n_draft, at, m in stash.segments:  # at: first chain row (masks 2..m) in the stash
        if m >= 2 and i in want and req_ids[i] == req_id and len(sampled[i]) == n_draft + 1:
            keep.append((i, at, m - 1))
    if not keep:
        return {}, False
    rows = torch.cat([torch.arange(at, at + c) for _, at, c in keep]) if len(keep) > 1 else \
        torch.arange(keep[0][1], keep[0][1] + keep[0][2])
    hidden = stash.hidden.index_select(0, rows)
    again = stash.logits is None  # compute_logits did not see this forward's rows (should not happen)
    logits = model.sbd_mask_logits(hidden) if again else stash.logits.index_select(0, rows).float()
    chains, at = {}, 0
    if head is None:
        best, probs = mask_chain.masks_top(logits, cut)
        best, probs = best.tolist(), probs.tolist() if probs is not None else None
        for i, _, c in keep:
            chains[i] = (best[at : at + c], probs[at : at + c] if probs is not None else None)
            at += c
        return chains, again
    from sbd.decoding.proposers.head import draft_table, walk

    tables = model.sbd_tables()
    for i, _, c in keep:
        first = torch.tensor(sampled[i][-1])
        values = draft_table(head, tables, hidden[at : at + c].float(), logits[at : at + c], first)
        chains[i] = (walk(values.tolist(), c), None)
        at += c
    return chains, again
