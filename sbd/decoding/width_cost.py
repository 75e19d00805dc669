"""How much a wider forward costs on this model and device: what adaptive drafting trades against.

`width_cost(model, batch)` is the extra time of one more token in a forward, relative to a 1-token
forward (0.004 / 15 tokens on an H100 by the paper's roofline; ~0.03–0.1 on a CPU, where a forward is
compute-bound). Measured once per model, batch size and device with a short cache, and remembered.
"""

from __future__ import annotations

import statistics
import time
import weakref

import torch
from transformers import DynamicCache

WIDE = 17  # the widest forward timed (a verify step at block 8)
_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _timed(model, ids, cache, past: int, device) -> float:
    pos = torch.arange(past, past + ids.shape[1], device=device)[None].expand(ids.shape[0], -1)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=ids.shape[1])
    if device.type == "cuda":
        torch.cuda.synchronize()
    cache.crop(-ids.shape[1])  # back to the prompt (transformers 5: a negative count to drop)
    return time.perf_counter() - t


def width_cost(model, batch: int = 1, context: int = 64, repeats: int = 5) -> float:
    """Relative extra cost of one more token in a forward: (time(WIDE) / time(1) − 1) / (WIDE − 1), ≥ 0."""
    key = (batch, str(model.get_input_embeddings().weight.device))
    known = _MEASURED.setdefault(model, {})
    if key in known:
        return known[key]
    device = model.get_input_embeddings().weight.device
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (batch, context), generator=g).to(device)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        one = torch.randint(0, vocab, (batch, 1), generator=g).to(device)
        wide = torch.randint(0, vocab, (batch, WIDE), generator=g).to(device)
        for ids in (one, wide):  # warm-up
            _timed(model, ids, cache, context, device)
        t1, tw = [], []
        for _ in range(repeats):  # interleaved
            t1.append(_timed(model, one, cache, context, device))
            tw.append(_timed(model, wide, cache, context, device))
    cost = max(0.0, (statistics.median(tw) / statistics.median(t1) - 1) / (WIDE - 1))
    known[key] = cost
    return cost
