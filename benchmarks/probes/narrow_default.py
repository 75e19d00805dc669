"""Float32 linear layers as W·xᵀ (`sbd.models.narrow_linear`, the default on AMD CPUs) against torch's own
F.linear, end to end on this machine: one SmolLM2 + its drafter, the two forms taking turns prompt by prompt
(8 prompts, twice, after a warm-up call each), NTP and sbd-verify with their defaults. It says which form
`sbd.load` should pick on this CPU (`narrow_linear.worth_it`).

    python benchmarks/probes/narrow_default.py chat      # or gsm
"""

from __future__ import annotations

import sys

import torch

import sbd
from sbd.models.narrow_linear import cpu_vendor, linear_layers
from turns import prompt_set, take_turns


def main(which: str) -> None:
    torch.set_num_threads(2)
    model, tok = sbd.load("smollm2", weights="float")
    print(f"CPU vendor: {cpu_vendor()}, MKL: {torch.backends.mkl.is_available()}")

    def run(narrow, method):
        def go(p):
            with linear_layers(model, narrow):
                return sbd.generate(model, tok, [p], max_new_tokens=96, chat=True, method=method)
        return go

    for method in ("ntp", "sbd-verify"):
        take_turns({"F.linear": run(False, method), "narrow": run(True, method)}, prompt_set(which),
                   f"float32 {which} {method}")


if __name__ == "__main__":
    main(sys.argv[1])
