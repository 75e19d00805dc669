"""Layers that share an input in one kernel call (`sbd.models.quantized.joint_product`: q, k, v; gate, up)
against a call per layer, as every quantized forward made before: one SmolLM2 + its drafter, the two
settings taking turns prompt by prompt (8 prompts, twice, after a warm-up call each), NTP and sbd-verify
with their defaults.

    python benchmarks/probes/joint_products.py int4 chat      # or int8; chat or gsm
"""

from __future__ import annotations

import sys

import sbd.decoding.llama_forward as llama_forward
from turns import patched_turns

JOINT = llama_forward.joint_product


def main(fmt: str, which: str) -> None:
    # read when a call's engine builds its forward
    patched_turns(llama_forward, "joint_product", {"per layer": lambda layers: None, "joint": JOINT}, fmt, which)


if __name__ == "__main__":
    main(*sys.argv[1:3])
