"""What the SmolLM2 drafting probes share: the prompt sets and settings that take turns prompt by prompt
(each setting warmed up once, then 8 prompts twice), reported as tokens/s, tokens per forward and whether
each setting wrote the same tokens as the first."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quantized_decoding import PROMPTS  # noqa: E402


def prompt_set(which: str, n: int = 8) -> list[str]:
    """"chat": everyday chat prompts; "gsm": held-out gsm_symbolic questions (seed 0, the test split)."""
    if which == "gsm":
        from sbd.tasks.splits import make_split

        return [ex["entry"]["question"] for ex in make_split("gsm_symbolic", "test", n, 0)]
    return PROMPTS[:n]


def take_turns(settings: dict[str, Callable[[str], object]], prompts: list[str], label: str) -> None:
    """Run each setting (prompt -> a `sbd.generate` result) on every prompt in turns and print the totals."""
    for run in settings.values():
        run(prompts[0])
    res = {k: [0, 0.0, 0, []] for k in settings}
    for p in prompts * 2:
        for k, run in settings.items():
            r = run(p)
            res[k][0] += r.num_tokens
            res[k][1] += r.seconds
            res[k][2] += r.nfe[0]
            res[k][3].append(r.token_ids[0])
    first = next(iter(res))
    for k, (n, s, f, t) in res.items():
        print(f"{label} {k}: {n / s:.1f} tokens/s, {n / f:.2f} tokens per forward, "
              f"same tokens as {first}: {t == res[first][3]}")


def patched_turns(module, name: str, settings: dict[str, object], fmt: str, which: str) -> None:
    """SmolLM2 + its drafter with `fmt` weights ("defaults": as `sbd.load` holds them; "float32"; "int8", "int4":
    requantized), NTP then sbd-verify with their defaults, each setting of `module.<name>` (label -> value) set
    before its calls, taking turns."""
    import torch

    import sbd

    torch.set_num_threads(2)
    model, tok = sbd.load("smollm2", weights={"float32": "float", "defaults": True}.get(fmt, fmt))

    def run(value, method):
        def go(p):
            setattr(module, name, value)
            return sbd.generate(model, tok, [p], max_new_tokens=96, chat=True, method=method)
        return go

    for method in ("ntp", "sbd-verify"):
        take_turns({label: run(value, method) for label, value in settings.items()}, prompt_set(which),
                   f"{fmt} {which} {method}")
