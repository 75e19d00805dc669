"""How much a wider forward costs on this model and device: what adaptive drafting trades against.

`forward_costs(model, batch)` times forwards of a few widths over a short cache and returns a function
giving the time of a w-token forward relative to a 1-token forward (interpolated between the widths
timed). On an H100 the paper's roofline puts a 16-token forward at 1.004x; on a CPU the step from 1 to
2 tokens alone can cost half a forward (a matrix-vector product becomes a matrix product), and the
cost then grows with the width. Measured once per model, batch size and device, and remembered.
"""

from __future__ import annotations

import bisect
import statistics
import time
import weakref
from typing import Callable

import torch
from transformers import DynamicCache

from ..adapter import gated
from ..models.cache_arg import with_cache
from ..models.narrow_linear import uses_narrow_linear

# The widths timed; a verify step with draft d is 2d + 2 wide. Both sides of every multiple of 8: narrow
# linear layers pad a forward's columns to a multiple of 8 beyond 8 (`sbd.models.narrow_linear`), so
# on SmolLM2 a 17-wide forward costs 1.2x a 16-wide one, a step a line through 9 and 17 cannot see
# (benchmarks/smollm2/results/adapter_forward_cost.md).
WIDTHS = (1, 2, 3, 4, 6, 8, 9, 16, 17, 24, 25, 33)
_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _timed(model, ids, cache, past: int, device) -> float:
    pos = torch.arange(past, past + ids.shape[1], device=device)[None].expand(ids.shape[0], -1)
    if device.type == "cuda":
        torch.cuda.synchronize()
    w = ids.shape[1]
    t = time.perf_counter()
    with gated(model, w // 2 if w > 1 else None):  # a verify forward: head and draft, then the gated masks
        model(input_ids=ids, position_ids=pos, **with_cache(model, cache), use_cache=True, logits_to_keep=w)
    if device.type == "cuda":
        torch.cuda.synchronize()
    cache.crop(-ids.shape[1])  # back to the prompt (transformers 5: a negative count to drop)
    return time.perf_counter() - t


def relative_costs(model, batch: int = 1, context: int = 64, repeats: int = 3) -> dict[int, float]:
    """{width: median time of a width-token forward / that of a 1-token forward} for `WIDTHS`."""
    key = (batch, str(model.get_input_embeddings().weight.device), uses_narrow_linear(model))
    known = _MEASURED.setdefault(model, {})
    if key in known:
        return known[key]
    device = model.get_input_embeddings().weight.device
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (batch, context), generator=g).to(device)
    cache = DynamicCache(config=model.config)
    times: dict[int, list[float]] = {w: [] for w in WIDTHS}
    with torch.inference_mode():
        model(input_ids=prompt, **with_cache(model, cache), use_cache=True, logits_to_keep=1)
        inputs = {w: torch.randint(0, vocab, (batch, w), generator=g).to(device) for w in WIDTHS}
        for w in WIDTHS:  # warm-up
            _timed(model, inputs[w], cache, context, device)
        for _ in range(repeats):  # widths interleaved
            for w in WIDTHS:
                times[w].append(_timed(model, inputs[w], cache, context, device))
    one = statistics.median(times[1])
    costs = {w: max(1.0, statistics.median(t) / one) if w > 1 else 1.0 for w, t in times.items()}
    wider = float("inf")
    for w in sorted(costs, reverse=True):  # a forward never costs more than a wider one: timing noise out
        costs[w] = wider = min(costs[w], wider) if w > 1 else 1.0
    known[key] = costs
    return costs


def forward_costs(model, batch: int = 1) -> Callable[[int], float]:
    """A function: width → time of such a forward relative to a 1-token forward (linear between the
    widths timed, extended linearly beyond the widest)."""
    return interpolate(relative_costs(model, batch))


def interpolate(costs: dict[int, float]) -> Callable[[int], float]:
    widths = sorted(costs)

    def cost(w: int) -> float:
        if w <= widths[0]:
            return costs[widths[0]]
        i = min(bisect.bisect_left(widths, w), len(widths) - 1)
        a, b = widths[i - 1], widths[i]
        return costs[a] + (costs[b] - costs[a]) * (w - a) / (b - a)
    return cost
