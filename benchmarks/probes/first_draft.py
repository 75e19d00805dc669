"""A row's first draft priced like every later one (`DraftOptions.price_first_draft`) against a whole block
of masks before any record exists (the engine before): one SmolLM2 + its drafter, the two settings taking
turns prompt by prompt (8 prompts, twice, after a warm-up call each), sbd-verify with its defaults.

    python benchmarks/probes/first_draft.py int4 chat      # or: int4 gsm, float32 chat, float32 gsm
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import sbd  # noqa: E402
from quantized_decoding import PROMPTS  # noqa: E402
from sbd.decoding.draft_policy import DraftOptions  # noqa: E402


def main(fmt: str, which: str) -> None:
    torch.set_num_threads(2)
    model, tok = sbd.load("smollm2", **({} if fmt == "float32" else {"weights": fmt}))
    if which == "gsm":
        from sbd.tasks.splits import make_split

        prompts = [ex["entry"]["question"] for ex in make_split("gsm_symbolic", "test", 8, 0)]
    else:
        prompts = PROMPTS[:8]
    settings = {"whole block": DraftOptions(price_first_draft=False), "priced": DraftOptions(price_first_draft=True)}
    for opts in settings.values():
        sbd.generate(model, tok, [prompts[0]], max_new_tokens=96, chat=True, draft_options=opts)
    res = {k: [0, 0.0, 0, []] for k in settings}
    for p in prompts * 2:
        for k, opts in settings.items():
            r = sbd.generate(model, tok, [p], max_new_tokens=96, chat=True, draft_options=opts)
            res[k][0] += r.num_tokens
            res[k][1] += r.seconds
            res[k][2] += r.nfe[0]
            res[k][3].append(r.token_ids[0])
    for k, (n, s, f, t) in res.items():
        print(f"{fmt} {which} {k}: {n / s:.1f} tokens/s, {n / f:.2f} tokens per forward, "
              f"same tokens as a whole block: {t == res['whole block'][3]}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
