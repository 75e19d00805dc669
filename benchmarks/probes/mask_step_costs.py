"""Steps that feed masks priced apart from those that do not (`StepCost.masks`), against one median per
width for both (the commit before): two copies of SmolLM2 + its drafter in one process, one switched back
to the old pricing, taking turns prompt by prompt (8 prompts, twice, after a warm-up call each).

    python benchmarks/probes/mask_step_costs.py int4 chat      # or: int4 gsm, float32 gsm, float32 chat
"""

from __future__ import annotations

import sys

import torch

import sbd
from sbd.decoding import width_cost
from sbd.decoding.width_cost import StepCost
from turns import prompt_set, take_turns


def main(fmt: str, which: str) -> None:
    real_add, real_masks = StepCost.add, StepCost.masks

    def add(self, w, s, masks=False):  # the old pricing: one median per width, whatever the step fed
        return real_add(self, w, s, False if getattr(self, "legacy", False) else masks)

    StepCost.add = add
    StepCost.masks = property(lambda self: self if getattr(self, "legacy", False) else real_masks.fget(self))
    torch.set_num_threads(2)
    models = {k: sbd.load("smollm2", weights="float" if fmt == "float32" else fmt) for k in ("one median", "apart")}
    width_cost.forward_costs(models["one median"][0], 1).legacy = True
    take_turns({k: (lambda p, m=m, t=t: sbd.generate(m, t, [p], max_new_tokens=96, chat=True))
                for k, (m, t) in models.items()}, prompt_set(which), f"{fmt} {which}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
