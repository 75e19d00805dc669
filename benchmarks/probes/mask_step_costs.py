"""Steps that feed masks priced apart from those that do not (`StepCost.masks`), against one median per
width for both (the commit before): two copies of SmolLM2 + its drafter in one process, one switched back
to the old pricing, taking turns prompt by prompt (8 prompts, twice, after a warm-up call each).

    python benchmarks/probes/mask_step_costs.py int4 chat      # or: int4 gsm, float32 gsm, float32 chat
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import sbd  # noqa: E402
from quantized_decoding import PROMPTS  # noqa: E402
from sbd.decoding import width_cost  # noqa: E402
from sbd.decoding.width_cost import StepCost  # noqa: E402


def main(fmt: str, which: str) -> None:
    real_add, real_masks = StepCost.add, StepCost.masks

    def add(self, w, s, masks=False):  # the old pricing: one median per width, whatever the step fed
        return real_add(self, w, s, False if getattr(self, "legacy", False) else masks)

    StepCost.add = add
    StepCost.masks = property(lambda self: self if getattr(self, "legacy", False) else real_masks.fget(self))
    torch.set_num_threads(2)
    models = {k: sbd.load("smollm2", **({} if fmt == "float32" else {"weights": fmt})) for k in ("one median", "apart")}
    width_cost.forward_costs(models["one median"][0], 1).legacy = True
    if which == "gsm":
        from sbd.tasks.splits import make_split

        prompts = [ex["entry"]["question"] for ex in make_split("gsm_symbolic", "test", 8, 0)]
    else:
        prompts = PROMPTS[:8]
    for m, t in models.values():
        sbd.generate(m, t, [prompts[0]], max_new_tokens=96, chat=True)
    res = {k: [0, 0.0, 0, []] for k in models}
    for p in prompts * 2:
        for k, (m, t) in models.items():
            r = sbd.generate(m, t, [p], max_new_tokens=96, chat=True)
            res[k][0] += r.num_tokens
            res[k][1] += r.seconds
            res[k][2] += r.nfe[0]
            res[k][3].append(r.token_ids[0])
    for k, (n, s, f, t) in res.items():
        print(f"{fmt} {which} {k}: {n / s:.1f} tokens/s, {n / f:.2f} tokens per forward, "
              f"same tokens as one median: {t == res['one median'][3]}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
