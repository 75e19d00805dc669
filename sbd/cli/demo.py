"""`sbd demo`: the shipped demo model decodes held-out problems with NTP and with SBD, side by side.

The demo model is the SBD-trained model of `sbd experiment tiny`, shipped inside the package
(`sbd/demo_model/`, written by `sbd experiment tiny --ship`); `sbd.load("demo")` returns it and
`sbd.load("demo-ntp")` the NTP-trained baseline.
"""

from __future__ import annotations

import json
import statistics
import sys

from ..models.loading import demo_path
from .args import gamma_value, positive_int
from .show import by_forward, print_table



def annotate(tokenizer, token_ids: list[int], steps: list[int], colour: bool) -> str:
    """The generated text with, for every token, the forward that revealed it: a colour per forward on a
    terminal, otherwise the forward number after each token, e.g. `47⟨1⟩`."""
    pieces = [(tokenizer.decode([tok], skip_special_tokens=True), step) for tok, step in zip(token_ids, steps)]
    return by_forward([(p, n) for p, n in pieces if p], colour)


def _decode_all(model, tokenizer, prompts, **kw):
    """Each prompt alone (batch 1: the latency setting), after one warm-up call."""
    from ..decoding import generate

    generate(model, tokenizer, prompts[:1], **kw)
    return [generate(model, tokenizer, [p], **kw) for p in prompts]


def run_demo(n: int = 8, gamma: float = 0.35, block_size: int = 16, seed: int = 0, max_new_tokens: int = 112,
             colour: bool | None = None, model_name: str = "demo") -> dict:
    from ..models.loading import load
    from ..tasks import make_split, score

    model, tokenizer = load(model_name)
    meta = json.loads((demo_path(model_name) / "sbd_demo.json").read_text())
    examples = [ex for task in meta["tasks"] for ex in make_split(task, "test", n, seed)]
    prompts = [ex["prompt"] for ex in examples]
    results = {}
    for method in ("ntp", "sbd"):
        runs = _decode_all(model, tokenizer, prompts, method=method, block_size=block_size, gamma=gamma,
                           max_new_tokens=max_new_tokens)
        scores = [score(ex["task"], ex["entry"], r.texts[0]) >= 1.0 for ex, r in zip(examples, runs)]
        tokens, nfe = sum(r.num_tokens for r in runs), sum(sum(r.nfe) for r in runs)
        seconds = sum(r.seconds for r in runs)
        results[method] = {"accuracy": sum(scores) / len(scores), "nfe": nfe, "tokens": tokens,
                           "seconds": seconds, "runs": runs, "median_seconds": statistics.median(r.seconds for r in runs)}
    ntp, sbd = results["ntp"], results["sbd"]
    colour = sys.stdout.isatty() if colour is None else colour
    print(f"Demo model: {demo_path(model_name)} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"SBD-trained), {len(examples)} held-out problems ({n} per task: {', '.join(meta['tasks'])}), "
          f"greedy, batch 1, block size {block_size}, γ = {gamma:g}\n")
    rows = [
        ("accuracy", f"{ntp['accuracy']:.1%}", f"{sbd['accuracy']:.1%}"),
        ("forwards per answer", f"{ntp['nfe'] / len(examples):.1f}", f"{sbd['nfe'] / len(examples):.1f}"),
        ("tokens per forward", f"{ntp['tokens'] / ntp['nfe']:.2f}", f"{sbd['tokens'] / sbd['nfe']:.2f}"),
        ("tokens/s", f"{ntp['tokens'] / ntp['seconds']:.0f}", f"{sbd['tokens'] / sbd['seconds']:.0f}"),
        ("NFE speedup", "1.00x", f"{ntp['nfe'] / sbd['nfe']:.2f}x"),
        ("wall-clock speedup", "1.00x", f"{ntp['seconds'] / sbd['seconds']:.2f}x"),
    ]
    print_table(["", "NTP decoding", "SBD decoding"], rows, colour)
    first = sbd["runs"][0]
    print("\nWorked example (SBD). Each token is marked with the forward pass that revealed it"
          + (" (one colour per forward):" if colour else " (⟨n⟩ = forward n):"))
    print(f"prompt: {prompts[0].rstrip()}")
    print(annotate(tokenizer, first.token_ids[0], first.steps[0], colour))
    print(f"-> {first.nfe[0]} forwards for {len(first.token_ids[0])} tokens "
          f"(NTP: {results['ntp']['runs'][0].nfe[0]}); score {score(examples[0]['task'], examples[0]['entry'], first.texts[0]):g}")
    return {m: {k: v for k, v in r.items() if k != "runs"} for m, r in results.items()}


def add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="decode held-out problems with the shipped demo model, NTP vs SBD",
                       description="Load the shipped SBD-trained demo model, decode a seeded sample of held-out "
                                   "problems with NTP and with SBD, print accuracy, forwards, tokens per forward, "
                                   "tokens/s and speedups, and one example showing which forward revealed each token.")
    p.add_argument("--n", type=positive_int, default=8, help="problems per task (default: 8)")
    p.add_argument("--gamma", type=gamma_value, default=0.35, help="EB-sampler bound γ (default: 0.35)")
    p.add_argument("--block-size", type=positive_int, default=16, help="tokens per block (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="which held-out problems (default: 0)")
    p.add_argument("--max-new-tokens", type=positive_int, default=112, help="generation budget (default: 112)")
    p.add_argument("--colour", choices=["auto", "always", "never"], default="auto",
                   help="colour the example by forward pass (default: auto = when printing to a terminal)")


def cmd_demo(args) -> None:
    colour = {"auto": None, "always": True, "never": False}[args.colour]
    run_demo(n=args.n, gamma=args.gamma, block_size=args.block_size, seed=args.seed,
             max_new_tokens=args.max_new_tokens, colour=colour)
