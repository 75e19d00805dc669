"""Drafts priced with the forward that restarts drafting after a refusal (`best_draft_length`, session 25)
against drafts priced alone (the rule before), and NTP: one SmolLM2 + its drafter, the three taking turns
prompt by prompt (8 prompts, twice, after a warm-up call each), sbd-verify with its defaults otherwise.

    python benchmarks/probes/restart_priced.py int4 chat      # or: int4 gsm, float32 chat, float32 gsm
"""

from __future__ import annotations

import sys

import torch

import sbd
from sbd.decoding import draft_policy
from sbd.decoding.draft_lengths import best_draft_length, expected_tokens
from turns import prompt_set, take_turns


def priced_alone(alpha, cost, longest, tree=(), restart=True):
    """The rule before: a draft's expected tokens over its own forward's width, nothing else."""
    best, value = 0, 1.0 / cost(1)
    for d in range(1, max(0, longest) + 1):
        v = expected_tokens(alpha, d) / cost(2 * d + 2 + sum(w - 1 for w in tree[:d]))
        if v > value + 1e-12:
            best, value = d, v
    return best


def main(fmt: str, which: str) -> None:
    torch.set_num_threads(2)
    model, tok = sbd.load("smollm2", weights="float" if fmt == "float32" else fmt)
    settings = {"ntp": (best_draft_length, {"method": "ntp"}), "priced alone": (priced_alone, {}),
                "with the restart": (best_draft_length, {})}

    def run(p, rule, kw):
        draft_policy.best_draft_length = rule
        return sbd.generate(model, tok, [p], max_new_tokens=96, chat=True, **kw)

    try:
        take_turns({k: (lambda p, s=s: run(p, *s)) for k, s in settings.items()}, prompt_set(which), f"{fmt} {which}")
    finally:
        draft_policy.best_draft_length = best_draft_length


if __name__ == "__main__":
    main(*sys.argv[1:3])
