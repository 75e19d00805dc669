"""New keys and values written as one slice per layer (`StepInputs.write_from`, rows of one length and no
padding) against the scatter over per-column positions that every forward used before: one SmolLM2 + its
drafter, the two settings taking turns prompt by prompt (8 prompts, twice, after a warm-up call each),
NTP and sbd-verify with their defaults.

    python benchmarks/probes/cache_writes.py int4 chat      # or float32, int8; chat or gsm
"""

from __future__ import annotations

import sys

import sbd.decoding.forward as forward
from turns import patched_turns

SLICED = forward.ModelForward.inputs


def scattered(self, *args, **kwargs):
    """The step's inputs without the slice: every layer scatters, as before."""
    step = SLICED(self, *args, **kwargs)
    step.write_from = None
    return step


def main(fmt: str, which: str) -> None:
    patched_turns(forward.ModelForward, "inputs", {"scatter": scattered, "slice": SLICED}, fmt, which)


if __name__ == "__main__":
    main(*sys.argv[1:3])
