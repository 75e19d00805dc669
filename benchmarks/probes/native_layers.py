"""The decoder layers from C++ (`sbd.decoding.native_layers`) against the Python layers, in turns prompt by
prompt: SmolLM2 + its drafter with its weights as loaded, NTP and sbd-verify with their defaults (8 prompts,
twice, after a warm-up call each).

    python benchmarks/probes/native_layers.py defaults chat      # or float32, int8, int4; chat or gsm
"""

from __future__ import annotations

import sys

import sbd.models.extension as extension
from turns import patched_turns


def main(fmt: str, which: str) -> None:
    # read when a call's engine builds its forward
    patched_turns(extension, "wanted", {"python": lambda: False, "native": lambda: True}, fmt, which)


if __name__ == "__main__":
    main(*sys.argv[1:3])
