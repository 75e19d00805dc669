"""The masks' chains the vLLM proposer drafts from: masks 2..k of a step's forward (kept by the model in its
stash) give the next step's draft through each request's own chain drafter, one sbd's rows hold too: the
masks' argmax (`MaskChain`, `sbd.decoding.proposers.chain`) or the sampler head's walk over their
candidates (`HeadChain`, `sbd.decoding.proposers.head`)."""

from __future__ import annotations

import torch

from sbd.decoding.proposers.base import Seen
from sbd.decoding.proposers.head import Drafting


@torch.inference_mode()
def mask_chains(model, head, stash, want: dict[int, object], sampled, req_ids, cut: bool):
    """({batch index: (chain, each token's drafting probability or None)}, whether the logits had to be
    projected again) for the requests in `want` (index -> the request's chain drafter) whose step ran as
    drafted (the stash's segment is theirs and every draft token stood). cut: the chain will be cut by
    confidence (send the probabilities; a sampler head's chains are not). One host read for all."""
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
    tables = model.sbd_tables() if head is not None else None
    parts, at = [], 0
    for i, _, c in keep:
        chain = want[i]
        chain.cut = cut and head is None
        drafting = Drafting(head, tables, hidden[at : at + c].float()) if head is not None else None
        parts += chain.values(Seen(logits[at : at + c], 0, torch.tensor(sampled[i][-1]), drafting))
        at += c
    values = torch.cat(parts).tolist()
    chains, at = {}, 0
    for i, _, _ in keep:
        chain = want[i]
        chains[i] = (chain.propose(values[at : at + chain.width]), chain.probs)
        at += chain.width
    return chains, again
