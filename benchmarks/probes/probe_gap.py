"""How often a row whose drafts do not pay puts up a probe (`DraftOptions.probe_every`): NTP and sbd-verify
with probes every 16, 48 and 128 plain steps, taking turns prompt by prompt (8 prompts, twice, after a
warm-up call each), one SmolLM2 + its drafter.

    python benchmarks/probes/probe_gap.py int4 chat      # or: int4 gsm, float32 chat, float32 gsm
"""

from __future__ import annotations

import sys

import torch

import sbd
from sbd.decoding.draft_policy import DraftOptions
from turns import prompt_set, take_turns

GAPS = (16, 48, 128)


def main(fmt: str, which: str) -> None:
    torch.set_num_threads(2)
    model, tok = sbd.load("smollm2", weights="float" if fmt == "float32" else fmt)
    settings = {"ntp": {"method": "ntp"}}
    settings.update({f"probe every {g}": {"draft_options": DraftOptions(probe_every=g)} for g in GAPS})
    take_turns({k: (lambda p, kw=kw: sbd.generate(model, tok, [p], max_new_tokens=96, chat=True, **kw))
                for k, kw in settings.items()}, prompt_set(which), f"{fmt} {which}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
