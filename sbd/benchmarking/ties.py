"""Where two greedy answers part, and whether float rounding decided it.

Greedy decoding of the same model can give different answers through different but equally exact
paths (one token per forward, or several verified at once; batched or alone) when, at some position,
the model's two best tokens are tied to within float rounding: the forwards sum in a different order
and the tie goes the other way. Hugging Face's own prompt-lookup parts from its greedy `generate` at
such places too. A benchmark that says "same answers" therefore also says which differences start at
a near tie, so that a real exactness bug (a wide gap) is never hidden behind one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Logit gap below which two tokens count as tied: float32 rounding across a forward of a few hundred
# tokens moves logits by ~1e-5 (measured on SmolLM2: 1.3e-5 decided one answer); a decision worth
# trusting is orders of magnitude wider.
TIE_GAP = 1e-3
# In 16-bit weights and activations every product and sum rounds to 8 (bfloat16) or 11 (float16) bits:
# logits of magnitude ~10 move by a few hundredths per rounding, and two equally exact paths (different
# attention kernels, one token or several per forward) part at gaps of that size. Random-weight models,
# whose logits are nearly flat, part there often.
HALF_GAPS = {torch.bfloat16: 0.25, torch.float16: 0.03}


def tie_gap(dtype: torch.dtype) -> float:
    """The gap under which two tokens count as tied for a model computing in `dtype`."""
    return HALF_GAPS.get(dtype, TIE_GAP)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where `a` and `b` differ (the shorter one's length when one extends the
    other); None when they are the same."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.no_grad()
def parting_gap(model, prompt: Sequence[int], reference: Sequence[int], other: Sequence[int]) -> float | None:
    """The model's logit gap between the two tokens the answers chose where they first part, from one
    uncached forward of the prompt and their common prefix (a drafting adapter acts on mask positions
    only, so this is the original model's next-token head). None when the answers are the same or one
    stops where the other goes on (no second token to compare)."""
    at = first_difference(reference, other)
    if at is None or at >= min(len(reference), len(other)):
        return None
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([list(prompt) + list(reference[:at])], device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()
    return abs(float(logits[reference[at]] - logits[other[at]]))


def parting_gaps(model, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]],
                 references: Sequence[Sequence[int]]) -> list[float | None]:
    """`parting_gap` of each answer that differs from its reference (None where it stops early)."""
    return [parting_gap(model, p, ref, a) for p, a, ref in zip(prompts, answers, references) if a != ref]


def near_ties(model, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]],
              references: Sequence[Sequence[int]], gap: float | None = None) -> int:
    """How many answers differ from their reference only from a near tie on (parting gap < `gap`,
    default `tie_gap` of the model's dtype)."""
    gap = tie_gap(model.dtype) if gap is None else gap
    return sum(g is not None and g < gap for g in parting_gaps(model, prompts, answers, references))
