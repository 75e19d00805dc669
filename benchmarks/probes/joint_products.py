"""Layers that share an input in one kernel call (`sbd.models.quantized.joint_product`: q, k, v; gate, up)
against a call per layer, as every quantized forward made before: one SmolLM2 + its drafter, the two
settings taking turns prompt by prompt (8 prompts, twice, after a warm-up call each), NTP and sbd-verify
with their defaults.

    python benchmarks/probes/joint_products.py int4 chat      # or int8; chat or gsm
"""

from __future__ import annotations

import sys

import torch

import sbd
import sbd.decoding.llama_forward as llama_forward
from turns import prompt_set, take_turns

JOINT = llama_forward.joint_product


def main(fmt: str, which: str) -> None:
    torch.set_num_threads(2)
    model, tok = sbd.load("smollm2", weights=fmt)

    def run(joint, method):
        def go(p):
            llama_forward.joint_product = joint  # read when the call's engine builds its forward
            return sbd.generate(model, tok, [p], max_new_tokens=96, chat=True, method=method)
        return go

    for method in ("ntp", "sbd-verify"):
        take_turns({"per layer": run(lambda layers: None, method), "joint": run(JOINT, method)},
                   prompt_set(which), f"{fmt} {which} {method}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
