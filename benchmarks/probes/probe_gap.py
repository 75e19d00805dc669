"""How often a row whose drafts do not pay puts up a probe (`DraftOptions.probe_every`): NTP and sbd-verify
with probes every 16, 48 and 128 plain steps, taking turns prompt by prompt (8 prompts, twice, after a
warm-up call each), one SmolLM2 + its drafter.

    python benchmarks/probes/probe_gap.py int4 chat      # or: int4 gsm, float32 chat, float32 gsm
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import sbd  # noqa: E402
from quantized_decoding import PROMPTS  # noqa: E402
from sbd.decoding.draft_policy import DraftOptions  # noqa: E402

GAPS = (16, 48, 128)


def main(fmt: str, which: str) -> None:
    torch.set_num_threads(2)
    model, tok = sbd.load("smollm2", **({} if fmt == "float32" else {"weights": fmt}))
    if which == "gsm":
        from sbd.tasks.splits import make_split

        prompts = [ex["entry"]["question"] for ex in make_split("gsm_symbolic", "test", 8, 0)]
    else:
        prompts = PROMPTS[:8]
    settings = {"ntp": {"method": "ntp"}}
    settings.update({f"probe every {g}": {"draft_options": DraftOptions(probe_every=g)} for g in GAPS})
    for kw in settings.values():
        sbd.generate(model, tok, [prompts[0]], max_new_tokens=96, chat=True, **kw)
    res = {k: [0, 0.0, 0, []] for k in settings}
    for p in prompts * 2:
        for k, kw in settings.items():
            r = sbd.generate(model, tok, [p], max_new_tokens=96, chat=True, **kw)
            res[k][0] += r.num_tokens
            res[k][1] += r.seconds
            res[k][2] += r.nfe[0]
            res[k][3].append(r.token_ids[0])
    for k, (n, s, f, t) in res.items():
        print(f"{fmt} {which} {k}: {n / s:.1f} tokens/s, {n / f:.2f} tokens per forward, "
              f"same tokens as NTP: {t == res['ntp'][3]}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
