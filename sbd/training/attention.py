"""Cheaper CPU training forward for SBD batches, computing exactly what the plain forward computes.

Two independent savings, both used by `SBDTrainer.compute_loss` and `benchmarks/train_step.py`:

1. Split attention (CPU/SDPA only). With the dense (B,1,T,T) bool mask SDPA computes all T² scores.
   But the clean half [0, n) is an ordinary causal LM: its real queries see exactly the keys
   `kv <= q` of the clean half (with right padding they never reach a padding key). So the clean
   queries run SDPA's causal kernel over the clean keys only, and just the noisy queries [n, T) use
   the dense mask rows `mask[..., n:, :]`. Padding queries of the clean half get a different output
   than under the dense mask (they see earlier tokens instead of only themselves), but nothing real
   ever attends to a padding position and padding carries no label, so loss and gradients are the
   same. Registered as the attention implementation `"sbd_split_sdpa"` through transformers'
   `AttentionInterface`; the model is switched to it only for the duration of one forward, and the
   function falls back to plain SDPA whenever the call is not an SBD training call (no
   `sbd_num_clean` kwarg, no 4-D bool mask, a KV cache, dropout).

2. Output layer at labelled positions only. The model is called with `logits_to_keep` = the boolean
   (B,T) map of positions that have a label (transformers' own slicing, applied before the model's
   head, so a head that scales or soft-caps its logits still does so); the logits come back as
   (N,V) rows in row-major order of the labelled positions. A model whose forward has no
   `logits_to_keep`, or that returns another shape, is refused by `supports_labelled_logits` /
   checked at run time, and the full logits are used instead (never a silent mismatch).
   Without a host read (`labelled_rows`, for CUDA): the labelled positions are found on the host
   before the batch goes to the device, and the model gets them as a (B,P) integer `logits_to_keep`
   (each row's labelled positions, padded to the most any row has); the (N,V) rows are then picked
   from the (B·P,V) logits with a precomputed index. A boolean `logits_to_keep` would make the device
   count the positions first (a sync mid-forward); the price is the head on B·P ≥ N rows.
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import torch

from .collator import IGNORE

SPLIT_ATTENTION = "sbd_split_sdpa"
NUM_CLEAN_KWARG = "sbd_num_clean"
_registered = False


def _split_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n = kwargs.pop(NUM_CLEAN_KWARG, None)
    t = query.shape[2]
    plain = (n is None or not isinstance(n, int) or not 0 < n < t or key.shape[2] != t
             or attention_mask is None or attention_mask.dtype != torch.bool or attention_mask.dim() != 4
             or attention_mask.shape[-2] != t or dropout != 0.0 or kwargs.get("position_bias") is not None
             or kwargs.get("cache") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    clean, _ = sdpa_attention_forward(module, query[:, :, :n], key[:, :, :n], value[:, :, :n], None,
                                      dropout=0.0, scaling=scaling, is_causal=True, **kwargs)
    noisy, _ = sdpa_attention_forward(module, query[:, :, n:], key, value, attention_mask[:, :, n:],
                                      dropout=0.0, scaling=scaling, is_causal=False, **kwargs)
    return torch.cat([clean, noisy], dim=1), None  # (B, T, H, D), as sdpa_attention_forward returns


def register() -> None:
    """Register `"sbd_split_sdpa"` (attention and mask functions) with transformers, once."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SPLIT_ATTENTION, _split_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SPLIT_ATTENTION, sdpa_mask)
    _registered = True


def _unwrap(model):
    while not hasattr(model, "config") and isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module  # DDP / FSDP wrappers
    return model


def can_split_attention(model, device=None) -> bool:
    """True on a non-CUDA device for a model running SDPA (CUDA keeps flex_attention / its own kernels)."""
    inner = _unwrap(model)
    config = getattr(inner, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if device is None:
        try:
            device = next(inner.parameters()).device
        except StopIteration:
            return False
    return torch.device(device).type != "cuda"


@contextlib.contextmanager
def split_attention(model, enabled: bool = True):
    """Within the block, an SDPA model (not on CUDA) uses the split attention for SBD calls."""
    if not enabled or not can_split_attention(model):
        yield False
        return
    register()
    config = _unwrap(model).config
    previous = config._attn_implementation
    config._attn_implementation = SPLIT_ATTENTION
    try:
        yield True
    finally:
        config._attn_implementation = previous


def supports_labelled_logits(model) -> bool:
    """Whether the model's forward takes a 2-D `logits_to_keep` (per-row positions or a boolean mask). Only
    modeling code that slices with transformers' `slice_logits_to_keep` does: older releases (5.17, say)
    index `hidden_states[:, keep, :]`, which takes an int or 1-D positions only and fails deep inside the
    model on a 2-D tensor. Others get full logits, gathered here."""
    inner = _unwrap(model)
    try:
        takes = "logits_to_keep" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False
    return takes and getattr(sys.modules.get(type(inner).__module__), "slice_logits_to_keep", None) is not None


def labelled_rows(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the labelled positions of `labels` (B,T) are, computed on the host before the batch moves to
    the device: (positions (B,P) long, each row's labelled positions in order, padded with position 0 up
    to P, the most any row has; select (N,) long, the N labelled ones among the B·P flattened rows, in
    row-major order: the order of `labels[labels != -100]`)."""
    valid = labels != IGNORE
    counts = valid.sum(1)
    p = max(int(counts.max()), 1) if valid.numel() else 1
    order = torch.argsort((~valid).to(torch.uint8), dim=1, stable=True)[:, :p]   # labelled columns first, in order
    used = torch.arange(p, device=labels.device)[None] < counts[:, None]
    positions = torch.where(used, order, 0)
    select = used.flatten().nonzero()[:, 0]
    return positions, select


def training_logits(model, inputs: dict, labels: torch.Tensor, num_clean: int | None = None, *,
                    split: bool = True, labelled_only: bool = True, rows: tuple | None = None,
                    num_labelled: int | None = None) -> torch.Tensor:
    """Logits for `sbd_loss`: (B,T,V) for the plain path, (N,V) at the labelled positions for the fast one.

    inputs: the model inputs of an SBD or NTP batch (no labels). num_clean: the clean length of an SBD
    batch with a dense mask (enables the split attention); None for an NTP batch. rows: `labelled_rows`
    of these labels (on the model's device): the labelled logits are then gathered without a host read.
    num_labelled: N, when the caller knows it (saves counting the labels on the device).
    """
    kwargs = dict(inputs)
    kwargs.setdefault("use_cache", False)
    keep = None
    labelled = labelled_only and supports_labelled_logits(model)
    if labelled and rows is not None:
        kwargs["logits_to_keep"] = rows[0]
    elif labelled:
        keep = labels != IGNORE
        kwargs["logits_to_keep"] = keep
    use_split = split and num_clean is not None and isinstance(kwargs.get("attention_mask"), torch.Tensor) \
        and kwargs["attention_mask"].dim() == 4 and int(num_clean) < kwargs["input_ids"].shape[1]
    with split_attention(model, enabled=use_split) as active:
        if active:
            kwargs[NUM_CLEAN_KWARG] = int(num_clean)
        logits = model(**kwargs).logits
    if labelled and rows is not None:
        positions, select = rows
        if logits.dim() != 3 or logits.shape[:2] != positions.shape:
            raise RuntimeError(f"{type(_unwrap(model)).__name__} returned logits of shape {tuple(logits.shape)} "
                               f"for an integer logits_to_keep of shape {tuple(positions.shape)}; call "
                               "training_logits without rows for this model")
        return logits.reshape(-1, logits.shape[-1]).index_select(0, select)
    if keep is not None:
        n = int(keep.sum()) if num_labelled is None else int(num_labelled)
        if logits.dim() == 3 and logits.shape[0] == 1 and logits.shape[1] == n:
            logits = logits[0]
        if logits.dim() != 2 or logits.shape[0] != n:
            raise RuntimeError(f"{type(_unwrap(model)).__name__} returned logits of shape {tuple(logits.shape)} "
                               f"for a boolean logits_to_keep with {n} positions; call training_logits with "
                               "labelled_only=False for this model")
    return logits
