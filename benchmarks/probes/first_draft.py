"""A row's first draft priced like every later one (`DraftOptions.price_first_draft`) against a whole block
of masks before any record exists (the engine before): one SmolLM2 + its drafter, the two settings taking
turns prompt by prompt (8 prompts, twice, after a warm-up call each), sbd-verify with its defaults.

    python benchmarks/probes/first_draft.py int4 chat      # or: int4 gsm, float32 chat, float32 gsm
"""

from __future__ import annotations

import sys

import torch

import sbd
from sbd.decoding.draft_policy import DraftOptions
from turns import prompt_set, take_turns


def main(fmt: str, which: str) -> None:
    torch.set_num_threads(2)
    model, tok = sbd.load("smollm2", weights="float" if fmt == "float32" else fmt)
    settings = {"whole block": DraftOptions(price_first_draft=False), "priced": DraftOptions(price_first_draft=True)}
    take_turns({k: (lambda p, o=o: sbd.generate(model, tok, [p], max_new_tokens=96, chat=True, draft_options=o))
                for k, o in settings.items()}, prompt_set(which), f"{fmt} {which}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
