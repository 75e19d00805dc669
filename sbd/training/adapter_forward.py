"""The training forward of a drafting adapter (docs/method.md §7): the masked loss without the cost of
the clean half's gradients.

With the adapter gated to the noisy copy, the clean half [0, n) of the doubled sequence is the frozen
model itself: nothing in it depends on a trainable parameter. So it runs once without autograd, as a
causal prefill into a KV cache, and the noisy half [n, T) runs after it with the adapter on, attending
to those cached keys/values under the rows of the training mask that belong to it. Loss and adapter
gradients are those of the plain doubled forward with the gate at n (`tests/test_adapter_training.py`
checks this to 1e-5); the clean half costs one forward without a backward, and no logits.

The optional distillation term is the KL divergence from the frozen model's next-token distribution
at each target (taken from the clean half of the same forward: position p − 1 predicts token p) to the
masked prediction of that target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..adapter import gated
from .collator import IGNORE


@dataclass
class AdapterOutputs:
    logits: torch.Tensor            # (N, V) masked predictions at the N labelled noisy positions, row-major
    base_logits: torch.Tensor | None  # (N, V) the frozen model's next-token logits for the same targets (KL)
    kl_valid: torch.Tensor | None   # (N,) bool: targets that are tokens of x (not EOS padding), KL applies


def _backbone(model):
    return model.base_model if model.base_model is not model else model.model


def adapter_logits(model, inputs: dict, labels: torch.Tensor, num_clean: int,
                   source_positions: torch.Tensor | None = None) -> AdapterOutputs:
    """Masked logits at the labelled noisy positions, computed in two passes (see the module docstring).

    inputs: the doubled batch (input_ids, position_ids, a (B,1,T,T) bool attention_mask). labels: (B,T),
    IGNORE everywhere in the clean half. source_positions: (B, T − n) the position in x each noisy
    position copies (−1 for EOS padding); given, the frozen model's next-token logits for each target
    are returned too (for the KL term).
    """
    from transformers import DynamicCache

    ids, pos, mask = inputs["input_ids"], inputs["position_ids"], inputs["attention_mask"]
    n = int(num_clean)
    keep = labels[:, n:] != IGNORE
    cache = DynamicCache()
    base_logits = kl_valid = None
    with torch.no_grad(), gated(model, None):
        hidden = _backbone(model)(input_ids=ids[:, :n], position_ids=pos[:, :n], attention_mask=mask[:, :, :n, :n],
                                  past_key_values=cache, use_cache=True).last_hidden_state
        if source_positions is not None:
            src = source_positions[keep]                              # (N,) position in x of each target
            kl_valid = src >= 1
            rows = keep.nonzero()[:, 0]
            prev = hidden[rows, (src - 1).clamp_min(0)]               # the clean position that predicts it
            base_logits = model.get_output_embeddings()(prev)
    with gated(model, 0):
        logits = model(input_ids=ids[:, n:], position_ids=pos[:, n:], attention_mask=mask[:, :, n:, :],
                       past_key_values=cache, use_cache=True, logits_to_keep=keep).logits
    if logits.dim() == 3:
        logits = logits[0] if logits.shape[0] == 1 and logits.shape[1] == int(keep.sum()) else logits[:, n:][keep]
    return AdapterOutputs(logits, base_logits, kl_valid)


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
