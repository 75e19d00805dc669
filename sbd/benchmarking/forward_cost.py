"""What one decoding forward costs, measured: time(w) for w new tokens over a cached prefix.

SBD saves forwards; it saves time only if a w-token forward costs little more than a 1-token forward.
`time_forwards` measures exactly the model calls the decoding loops make (our KV cache, our masks,
`logits_to_keep`, a drafting adapter switched on for the block as decoding does), with the shapes
interleaved round by round so that machine noise hits every shape alike, after warm-up, and returns
medians. `forward_cost_table` lays them out as time(w)/time(1) per
batch size and cached length (the measured counterpart of the paper's roofline tables).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Iterable

import torch

from ..drafters.adapter import gated
from ..decoding.attention import flash_causal, fold_for, head_groups, routed, rows_plan, supports, uniform_plan
from ..decoding.cache import crop, slab_cache
from ..decoding.forward import ModelForward
from ..decoding.generate import compiled
from ..models.facts import context_limit
from ..errors import SBDError
from ..masks import inference_mask
from ..models.cache_arg import with_cache
from ..modes import eval_mode

WIDTHS = (1, 2, 4, 8, 16, 32, 64)
ATTENTIONS = ("auto", "rows", "dense")  # see `Shape.attention`


@dataclass(frozen=True)
class Shape:
    """One kind of decoding forward: `batch` rows, `width` new tokens of which the first `n_commit` are
    causal (committed to the cache) and the rest one bidirectional block, over `cached` cached tokens.

    attention: how the forward attends (`sbd.decoding.attention`): "auto" as the engine runs rows of one
    length (no mask tensor, through sbd's own forward of Llama-family models where it runs the model,
    `sbd.decoding.llama_forward`; the dense mask for a model not on SDPA), "rows" as it runs a ragged batch (one
    per-row mask, key/value heads shared), "dense" Hugging Face's SDPA with the dense mask (heads copied)."""

    batch: int
    width: int
    cached: int
    n_commit: int = -1  # -1: causal when width == 1 (an NTP step), a block of masks otherwise
    attention: str = "auto"
    compiled: bool = False  # through `torch.compile` (CUDA: CUDA graphs), as `generate(compile=True)` runs it

    @property
    def commit(self) -> int:
        if self.n_commit >= 0:
            return self.n_commit
        return 1 if self.width == 1 else 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prefilled(model, batch: int, cached: int, room: int, device, generator, static: bool = False):
    """A cache holding `cached` random tokens per row, with room for `room` more (static: fixed addresses)."""
    vocab = model.get_input_embeddings().num_embeddings
    cache = slab_cache(model, cached + room, static)
    pad = torch.zeros(batch, dtype=torch.long, device=device)
    if cached:
        chunk = 2048  # prefill long contexts in pieces: a 16k-token causal mask at once is 1 GiB of bools
        for start in range(0, cached, chunk):
            n = min(chunk, cached - start)
            ids = torch.randint(3, vocab, (batch, n), generator=generator).to(device)
            pos = (start + torch.arange(n, device=device))[None].expand(batch, -1)
            model(input_ids=ids, position_ids=pos, attention_mask=inference_mask(pad, start, n, 0),
                  **with_cache(model, cache), use_cache=True, logits_to_keep=1)
    return cache, pad


def time_forwards(model, shapes: Iterable[Shape], repeats: int = 10, warmup: int = 2, seed: int = 0) -> dict[Shape, float]:
    """Median seconds of one forward of each shape. Shapes with the same (batch, cached) share one
    prefilled cache; within it the shapes take turns, `warmup` rounds untimed, then `repeats` timed."""
    shapes = list(dict.fromkeys(shapes))
    if repeats < 1 or warmup < 0:
        raise SBDError("repeats must be >= 1 and warmup >= 0")
    limit = context_limit(model)
    for s in shapes:
        if s.batch < 1 or s.width < 1 or s.cached < 0 or s.commit > s.width:
            raise SBDError(f"impossible forward shape {s}")
        if s.attention not in ATTENTIONS:
            raise SBDError(f"unknown attention {s.attention!r}; choose from {', '.join(ATTENTIONS)}")
        if s.attention == "rows" and not supports(model):
            raise SBDError("attention 'rows' needs a transformers model on SDPA attention")
        if limit is not None and s.cached + s.width > limit:
            raise SBDError(f"{s.cached} cached + {s.width} new tokens exceed the model's context of {limit}")
    device = model.get_input_embeddings().weight.device
    vocab = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(seed)
    groups: dict[tuple[int, int], list[Shape]] = {}
    for s in shapes:
        groups.setdefault((s.batch, s.cached), []).append(s)
    result: dict[Shape, float] = {}
    try:  # the engine's own forward, where it runs this model (eager "auto" shapes)
        lean = ModelForward(model).lean
    except SBDError:  # a model the engine refuses (quantized weights without routed attention) times as it is
        lean = None
    with eval_mode(model), torch.inference_mode():
        for (batch, cached), group in groups.items():
            cache, pad = _prefilled(model, batch, cached, max(s.width for s in group), device, gen,
                                    any(s.compiled for s in group))
            calls = []
            for s in group:
                ids = torch.randint(3, vocab, (batch, s.width), generator=gen).to(device)
                pos = (cached + torch.arange(s.width, device=device))[None].expand(batch, -1)
                keep = max(1, s.width - s.commit)
                kw = dict(input_ids=ids, position_ids=pos, **with_cache(model, cache), use_cache=True,
                          logits_to_keep=keep)
                calls.append((s, _attending(model, s, kw, pad, cached)))
            times: dict[Shape, list[float]] = {s: [] for s in group}
            for round_ in range(warmup + repeats):
                for s, kw in calls:
                    _sync(device)
                    start = time.perf_counter()
                    with gated(model, s.commit if s.commit < s.width else None), \
                            routed(model, "sbd_layout" in kw):  # a drafting adapter's cost; sbd's attention
                        if lean is not None and s.attention == "auto" and not s.compiled:
                            lean(kw["input_ids"], kw["position_ids"], cache, kw["sbd_layout"], kw["logits_to_keep"])
                        else:
                            (compiled(model) if s.compiled else model)(**kw)
                    _sync(device)
                    if round_ >= warmup:
                        times[s].append(time.perf_counter() - start)
                    crop(cache, s.width)
            result.update({s: statistics.median(t) for s, t in times.items()})
            del cache
    return result


def _attending(model, s: Shape, kw: dict, pad, cached: int) -> dict:
    """The call's keywords with its attention as `s.attention` says (the mask, or sbd's layout)."""
    if s.attention == "dense" or not supports(model):
        return {**kw, "attention_mask": inference_mask(pad, cached, s.commit, s.width - s.commit)}
    if s.attention == "auto":
        layout = uniform_plan(cached, s.commit, s.width, False, flash_causal(model), pad.device)
    else:
        mask = inference_mask(pad, cached, s.commit, s.width - s.commit)
        fold = fold_for(pad.device, head_groups(model))
        layout = rows_plan(mask, fold, model.get_input_embeddings().weight.dtype)
    return {**kw, "attention_mask": None, "sbd_layout": layout}


@dataclass
class CostRow:
    """time(width) of one (batch, cached) cell and its ratio to time(1) of the same cell."""

    batch: int
    cached: int
    width: int
    ms: float
    ratio: float
    attention: str = "auto"
    compiled: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def fits(model, width: int, cached: Iterable[int]) -> bool:
    """Whether `width` new tokens fit over every cached length within the model's context."""
    limit = context_limit(model)
    return limit is None or max(cached) + width <= limit


def forward_cost_table(model, widths: Iterable[int] = WIDTHS, batches: Iterable[int] = (1,),
                       cached: Iterable[int] = (256,), repeats: int = 10, warmup: int = 2,
                       progress: bool = True, attentions: Iterable[str] = ("auto",),
                       compile: Iterable[bool] = (False,)) -> list[CostRow]:
    """time(w)/time(1) for every width, batch size and cached length; a width that does not fit over a
    cached length within the model's context is an SBDError naming both. w > 1 is a block of w masks, w = 1
    an NTP step. Each attention path (`Shape.attention`)
    is timed in the same rounds as the others; its ratios are to its own 1-token step. compile (False,
    True): each shape also through `torch.compile`, in the same rounds (the first call of a shape compiles,
    untimed: warm-up)."""
    from tqdm.auto import tqdm

    widths = sorted(set(widths) | {1})
    attentions, compile = list(dict.fromkeys(attentions)), list(dict.fromkeys(compile))
    limit = context_limit(model)
    for c in sorted(set(cached)):
        if limit is not None and c + widths[-1] > limit:
            w = next(w for w in widths if c + w > limit)
            room = (f"; the widest that fits there is {limit - c}" if limit > c else
                    f"; cached lengths go up to {limit - 1}")
            raise SBDError(f"width {w} over {c} cached tokens needs {c + w} positions, beyond the model's context of "
                           f"{limit}{room}")
    cells = [(b, c) for b in batches for c in cached]
    rows = []
    for b, c in tqdm(cells, desc="forward cost", unit="cell", disable=not progress):
        paths = [(a, k) for k in compile for a in attentions]
        t = time_forwards(model, [Shape(b, w, c, attention=a, compiled=k) for a, k in paths for w in widths],
                          repeats=repeats, warmup=max(warmup, 1 if any(compile) else 0))
        for a, k in paths:
            one = t[Shape(b, 1, c, attention=a, compiled=k)]
            rows += [CostRow(b, c, w, 1e3 * t[Shape(b, w, c, attention=a, compiled=k)],
                             t[Shape(b, w, c, attention=a, compiled=k)] / one, a, k) for w in widths]
    return rows
