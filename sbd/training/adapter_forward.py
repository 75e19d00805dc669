"""The training forward of a drafting adapter (docs/method.md §7): the masked loss without the cost of
the clean half's gradients.

With the adapter gated to the noisy copy, the clean half [0, n) of the doubled sequence is the frozen
model itself: nothing in it depends on a trainable parameter. So it runs once without autograd, as a
causal prefill into a KV cache, and the noisy half [n, T) runs after it with the adapter on, attending
to those cached keys/values under the rows of the training mask that belong to it. Loss and adapter
gradients are those of the plain doubled forward with the gate at n (`tests/test_adapter_training.py`
checks this to 1e-5); the clean half costs one forward without a backward, and no logits.

Three more savings, each exact for what the loss reads:
- the clean half runs only as far as a noisy query (or a KL target) looks into it: a batch whose noisy
  copy holds a few blocks (`SBDDataCollator(noisy_blocks=...)`) stops its clean forward after the last;
- the clean half is an ordinary causal prefill (right padding: no real position sees a padding one),
  so it runs SDPA's causal kernel instead of the dense mask;
- `grad_from_layer=L`: with the adapter's parameters below decoder layer L frozen (and its mask
  embedding), nothing below L can receive a gradient, so the noisy half runs those layers without
  autograd: no saved activations, no backward through them.

The optional distillation term is the KL divergence from the frozen model's next-token distribution
at each target (taken from the clean half of the same forward: position p − 1 predicts token p) to the
masked prediction of that target. The optional latent-consistency term (Apple's LCM, arXiv 2507.11851)
pulls the mask's last hidden state (the output layer's input) toward the frozen model's at the position
that predicts the same token, read from the same clean pass (`latent_sum`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..drafters.adapter import adapter_of, gated
from ..errors import SBDError
from ..models.cache_arg import with_cache
from ..drafters.sampler_head import capture_output_input
from .attention import supports_labelled_logits
from .collator import IGNORE


@dataclass
class AdapterOutputs:
    logits: torch.Tensor            # (N, V) masked predictions at the N labelled noisy positions, row-major
    base_logits: torch.Tensor | None  # (N, V) the frozen model's next-token logits for the same targets (KL)
    kl_valid: torch.Tensor | None   # (N,) bool: targets that are tokens of x (not EOS padding), KL applies
    hidden: torch.Tensor | None = None  # (N, H) the output layer's input at the same positions (sampler head)
    base_hidden: torch.Tensor | None = None  # (N, H) the frozen model's output-layer input that predicts each target


def _backbone(model):
    return model.base_model if model.base_model is not model else model.model


def clean_span(mask: torch.Tensor, num_clean: int, targets: torch.Tensor | None = None) -> int:
    """How many clean positions the noisy half needs: up to the last clean key a noisy query may see, and
    (KL) up to the position before the last target `targets` (positions in x). At least 1."""
    n = int(num_clean)
    seen = mask[:, 0, n:, :n].any(dim=0).any(dim=0).nonzero()
    need = int(seen[-1]) + 1 if seen.numel() else 1
    if targets is not None and targets.numel():
        need = max(need, int(targets.max()))
    return max(1, min(n, need))


@contextlib.contextmanager
def grad_from_layer(model, layer: int):
    """Autograd off in decoder layers below `layer` for the forwards inside (the embeddings included).

    Only correct when nothing below `layer` trains: `freeze_below` makes it so."""
    layers = _backbone(model).layers
    if not layer:
        yield
        return
    if not 0 < layer < len(layers):
        raise SBDError(f"grad_from_layer must lie in 1..{len(layers) - 1} for this model, got {layer}")
    outer = torch.is_grad_enabled()

    def switch(on: bool):
        def hook(*_):  # returns None: the layer's inputs stay as they are
            torch.set_grad_enabled(on)
        return hook

    hooks = [layers[0].register_forward_pre_hook(switch(False)), layers[layer].register_forward_pre_hook(switch(outer))]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        torch.set_grad_enabled(outer)


def freeze_below(model, layer: int) -> int:
    """Freeze the adapter's updates in decoder layers below `layer` and its mask embedding (they keep
    their values and still act); returns how many parameters still train."""
    adapter = adapter_of(model)
    if adapter is None:
        raise SBDError("freeze_below needs a model with a drafting adapter")
    n_layers = len(_backbone(model).layers)
    if not 0 <= layer < n_layers:
        raise SBDError(f"--train-layers-from must lie in 0..{n_layers - 1} for this model, got {layer}")
    if layer:
        adapter.mask_embedding.requires_grad_(False)
        below = {id(m) for block in _backbone(model).layers[:layer] for m in block.modules()}
        for name in adapter.names:  # a targeted layer below `layer` is a module of one of those blocks
            if id(model.get_submodule(name)) in below:
                for weights in adapter.update_of(name):
                    weights.requires_grad_(False)
    return sum(p.numel() for p in adapter.parameters() if p.requires_grad)


def adapter_logits(model, inputs: dict, labels: torch.Tensor, num_clean: int,
                   source_positions: torch.Tensor | None = None, grad_layer: int = 0,
                   with_hidden: bool = False, base_hidden: bool = False, base_logits: bool = True) -> AdapterOutputs:
    """Masked logits at the labelled noisy positions, computed in two passes (see the module docstring).

    inputs: the doubled batch (input_ids, position_ids, a (B,1,T,T) bool attention_mask). labels: (B,T),
    IGNORE everywhere in the clean half. source_positions: (B, T − n) the position in x each noisy
    position copies (−1 for EOS padding); given, the frozen model's next-token logits for each target
    are returned too (for the KL term). grad_layer: see `grad_from_layer` (0: autograd everywhere).
    with_hidden: also return the final hidden states at the same positions (what a sampler head reads).
    base_hidden: with source_positions, also return the frozen model's final hidden state that predicts
    each target (the latent-consistency term's target). base_logits: False skips the frozen model's
    logits (an N × vocabulary projection) when only base_hidden is wanted.
    """
    from transformers import DynamicCache

    ids, pos, mask = inputs["input_ids"], inputs["position_ids"], inputs["attention_mask"]
    n = int(num_clean)
    keep = labels[:, n:] != IGNORE
    src = source_positions[keep] if source_positions is not None else None     # (N,) position in x of each target
    c = clean_span(mask, n, src)
    cache = DynamicCache()
    want_logits, base_logits, kl_valid, prev = base_logits, None, None, None
    with torch.no_grad(), gated(model, None):  # causal: right padding is never seen by a real position
        hidden = _backbone(model)(input_ids=ids[:, :c], position_ids=pos[:, :c], attention_mask=None,
                                  **with_cache(model, cache), use_cache=True).last_hidden_state
        if src is not None:
            kl_valid = src >= 1
            rows = keep.nonzero()[:, 0]
            prev = hidden[rows, (src - 1).clamp_min(0)]               # the clean position that predicts it
            if want_logits:
                base_logits = model.get_output_embeddings()(prev)
    noisy_mask = torch.cat([mask[:, :, n:, :c], mask[:, :, n:, n:]], dim=-1)
    capture = capture_output_input(model) if with_hidden else contextlib.nullcontext()
    with gated(model, 0), grad_from_layer(model, grad_layer), capture as box:
        logits = model(input_ids=ids[:, n:], position_ids=pos[:, n:], attention_mask=noisy_mask,
                       **with_cache(model, cache), use_cache=True,
                       logits_to_keep=keep if supports_labelled_logits(model) else 0).logits
    hidden = _labelled_rows(box[0], keep) if with_hidden else None
    return AdapterOutputs(_labelled_rows(logits, keep), base_logits, kl_valid, hidden,
                          prev if base_hidden else None)


def _labelled_rows(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(N, ·) rows of the labelled positions, whether the model sliced with `logits_to_keep` or not: x is
    (N, ·) or (1, N, ·) sliced, or (B, M, ·) over the M noisy positions fed (N ≤ M)."""
    if x.dim() == 3:
        return x[keep] if x.shape[1] == keep.shape[1] else x[0]
    return x


def plain_adapter_logits(model, inputs: dict, labels: torch.Tensor, num_clean: int) -> torch.Tensor:
    """The reference: one forward of the whole doubled sequence with the gate at `num_clean`;
    logits at the labelled positions (N, V). Slower; tests compare `adapter_logits` against it."""
    with gated(model, int(num_clean)):
        logits = model(**inputs, use_cache=False).logits
    return logits[labels != IGNORE]


def kl_sum(logits: torch.Tensor, base_logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Σ over valid targets of KL(p_base ‖ q_masked), in fp32."""
    if not bool(valid.any()):
        return logits.sum() * 0.0
    logq = F.log_softmax(logits[valid].float(), dim=-1)
    logp = F.log_softmax(base_logits[valid].float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum()


def latent_sum(hidden: torch.Tensor, base_hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Σ over valid targets of the mean squared distance between the mask's final hidden state and the
    frozen model's (detached) at the position that predicts the same token, in fp32."""
    if not bool(valid.any()):
        return hidden.sum() * 0.0
    diff = hidden[valid].float() - base_hidden[valid].detach().float()
    return diff.pow(2).mean(dim=-1).sum()
