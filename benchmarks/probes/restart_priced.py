"""Drafts priced with the forward that restarts drafting after a refusal (`best_draft_length`, session 25)
against drafts priced alone (the rule before), and NTP: one SmolLM2 + its drafter, the three taking turns
prompt by prompt (8 prompts, twice, after a warm-up call each), sbd-verify with its defaults otherwise.

    python benchmarks/probes/restart_priced.py int4 chat      # or: int4 gsm, float32 chat, float32 gsm
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import sbd  # noqa: E402
from quantized_decoding import PROMPTS  # noqa: E402
from sbd.decoding import draft_policy  # noqa: E402
from sbd.decoding.draft_lengths import best_draft_length, expected_tokens  # noqa: E402


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
    model, tok = sbd.load("smollm2", **({} if fmt == "float32" else {"weights": fmt}))
    if which == "gsm":
        from sbd.tasks.splits import make_split

        prompts = [ex["entry"]["question"] for ex in make_split("gsm_symbolic", "test", 8, 0)]
    else:
        prompts = PROMPTS[:8]
    settings = {"ntp": (best_draft_length, {"method": "ntp"}), "priced alone": (priced_alone, {}),
                "with the restart": (best_draft_length, {})}

    def run(name, p):
        draft_policy.best_draft_length = settings[name][0]
        return sbd.generate(model, tok, [p], max_new_tokens=96, chat=True, **settings[name][1])

    for name in settings:
        run(name, prompts[0])
    res = {k: [0, 0.0, 0, []] for k in settings}
    for p in prompts * 2:
        for name in settings:
            r = run(name, p)
            res[name][0] += r.num_tokens
            res[name][1] += r.seconds
            res[name][2] += r.nfe[0]
            res[name][3].append(r.token_ids[0])
    draft_policy.best_draft_length = best_draft_length
    for k, (n, s, f, t) in res.items():
        print(f"{fmt} {which} {k}: {n / s:.1f} tokens/s, {n / f:.2f} tokens per forward, "
              f"same tokens as NTP: {t == res['ntp'][3]}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
