"""The `sbd` command: a thin layer over the library. User mistakes print one line and exit 2."""

from __future__ import annotations

import argparse
import sys

from .. import interrupts
from ..errors import SBDError
from .args import add_weights_option, weights_arg
from .args import gamma_value as _gamma
from .args import positive_int as _positive
from .bench import add_bench_parser, cmd_bench
from .drafting import add_drafting_options, drafting_kwargs
from .forward_cost import add_forward_cost_parser, cmd_forward_cost
from .roofline import add_roofline_parser, cmd_roofline
from .serve import add_serve_parser, add_vllm_setup_parser, cmd_serve, cmd_vllm_setup
from .import_model import add_import_parser, cmd_import
from .lm_eval import add_lm_eval_parser, run_lm_eval
from .convergence import add_convergence_parser, cmd_convergence
from .demo import add_demo_parser, cmd_demo
from .distill import add_distill_parser, cmd_distill
from .eval import add_eval_parser, cmd_eval
from .show import print_table
from .experiment import add_experiment_parser, cmd_experiment
from .train import add_train_parser, cmd_train


def _add_init(sub) -> None:
    p = sub.add_parser("init", help="create a small random model and its tokenizer in a folder",
                       description="Create a randomly initialised Llama-style model (or another family) with a "
                                   "byte-level BPE tokenizer trained on --corpus and an SBD mask token. Its output "
                                   "is random text until it is trained.")
    p.add_argument("--out", required=True, help="folder to write the model to (created; must be empty)")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out, replacing its model files")
    p.add_argument("--arch", default="llama", choices=["llama", "qwen2", "qwen3", "mistral"],
                   help="model family (default: llama)")
    p.add_argument("--corpus", help="text file to train the tokenizer on (default: a few built-in sentences)")
    p.add_argument("--vocab-size", type=_positive, default=512, help="tokenizer vocabulary size (default: 512)")
    p.add_argument("--hidden", type=_positive, default=128, help="hidden size (default: 128)")
    p.add_argument("--layers", type=_positive, default=4, help="number of transformer layers (default: 4)")
    p.add_argument("--heads", type=_positive, default=4, help="attention heads (default: 4)")
    p.add_argument("--kv-heads", type=_positive, default=2, help="key/value heads (default: 2)")
    p.add_argument("--context", type=_positive, default=1024, help="maximum sequence length (default: 1024)")
    p.add_argument("--seed", type=int, default=0, help="initialisation seed (default: 0)")


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="decode prompts with SBD or NTP: answers on stdout, statistics on stderr",
                       description="Decode each prompt with Set Block Decoding (or plain next-token decoding); print "
                                   "the answers on stdout (one answer alone, several under a label each) and the "
                                   "statistics on stderr: forward passes (NFE), tokens per forward and tokens/s.")
    p.add_argument("prompts", nargs="+", help="one or more prompts (each a string)")
    p.add_argument("--model", required=True, help="local Hugging Face model folder (safetensors)")
    p.add_argument("--method", default="sbd-verify", choices=["sbd-verify", "sbd", "ntp"],
                   help="sbd-verify: SBD drafts checked by the model's own next-token head, its exact answers in "
                        "fewer forwards (default, as in sbd serve); ntp: one token per forward; sbd: the paper's "
                        "set block decoding, not the model's own answers (refused for a drafter not trained for it)")
    p.add_argument("--block-size", type=_positive, default=None,
                   help="tokens per block (default: the block size a drafting adapter was trained for, else the "
                        "model's recorded best, else 16)")
    add_drafting_options(p)
    p.add_argument("--gamma", type=_gamma, default=None,
                   help="EB-sampler bound, for --method sbd and sbd-verify's --draft eb: 0 reveals one token per "
                        "forward, inf a whole block (default: 0.35)")
    p.add_argument("--proxy", default=None, choices=["entropy", "confidence", "margin"],
                   help="uncertainty proxy the EB sampler sorts by, for --method sbd and sbd-verify's --draft eb "
                        "(default: entropy)")
    p.add_argument("--anchor", action="store_true",
                   help="method sbd: anchored on the model's own next token (each forward takes the next-token "
                        "head's token, then the masks' tokens after it left to right under --gamma); runs on "
                        "drafters trained for sbd-verify too")
    p.add_argument("--max-new-tokens", type=_positive, default=128, help="generation budget (default: 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling at temperature > 0")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--compare", action="store_true",
                   help="run NTP, SBD and SBD-verify on the same prompts, side by side; speedups are against NTP")
    p.add_argument("--chat", action="store_true",
                   help="put each prompt through the tokenizer's chat template as a user message (instruct models)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_weights_option(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sbd", description="Set Block Decoding for language models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_init(sub)
    _add_generate(sub)
    add_train_parser(sub)
    add_distill_parser(sub)
    add_eval_parser(sub)
    add_convergence_parser(sub)
    add_experiment_parser(sub)
    add_demo_parser(sub)
    add_bench_parser(sub)
    add_forward_cost_parser(sub)
    add_roofline_parser(sub)
    add_import_parser(sub)
    add_lm_eval_parser(sub)
    add_serve_parser(sub)
    add_vllm_setup_parser(sub)
    return parser


def _stats(result, weights: str) -> dict:
    stats = {
        "weights": weights,
        "NFE": sum(result.nfe),
        "tokens": result.num_tokens,
        "tokens/forward": f"{result.tokens_per_forward:.2f}",
        "tokens/s": f"{result.tokens_per_second:.1f}",
        "seconds": f"{result.seconds:.3f}",
    }
    if result.method == "sbd-verify":
        kept = sum(a for row in result.accepted for a in row)
        stats["draft tokens kept"] = kept
        stats["of them from lookup"] = sum(result.lookup_accepted)
        stats["drafting"] = result.settings.describe()
    return stats


def cmd_init(args) -> None:
    from pathlib import Path

    from ..models import tiny

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SBDError(f"--out {args.out!r} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise SBDError(f"--out {args.out!r} is not empty (it may hold a trained model); choose an empty folder "
                       "or pass --force to replace what is there")
    texts = tiny.SAMPLE_TEXT
    if args.corpus:
        path = Path(args.corpus)
        if not path.is_file():
            raise SBDError(f"corpus file {args.corpus!r} does not exist")
        try:
            raw = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise SBDError(f"corpus file {args.corpus!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                           f"{e.start}); save it as UTF-8") from None
        texts = [line for line in raw.splitlines() if line.strip()]
        if not texts:
            raise SBDError(f"corpus file {args.corpus!r} is empty")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise SBDError("--hidden must be divisible by --heads, and --heads by --kv-heads")
    model, tokenizer = tiny.create(args.out, arch=args.arch, texts=texts, vocab_size=args.vocab_size,
                                   seed=args.seed, hidden=args.hidden, layers=args.layers, heads=args.heads,
                                   kv_heads=args.kv_heads, context=args.context)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote a random {args.arch} model ({n / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}) to {args.out}")


def cmd_generate(args) -> None:
    from ..decoding import generate
    from ..decoding.trained_for import check_decoding
    from ..models.loading import load

    _unread_options(args)  # settings nothing would read: refused before the model loads
    model, tokenizer = load(args.model, device=args.device, weights=weights_arg(args))
    from ..decoding.generate import check_context, encode_prompts

    # the user's budget is checked before the short warm-up calls, so an error names the user's numbers
    check_context(model, encode_prompts(tokenizer, args.prompts, args.chat), args.max_new_tokens)
    anchored = args.anchor
    if args.compare and not anchored:
        anchored = _compare_sbd_row(model, args)
    elif args.method == "sbd" or args.compare:  # refused for a drafter not trained for it, naming the options
        check_decoding(model, "sbd", anchor=anchored, interface="cli")
    if anchored and args.proxy not in (None, "entropy"):
        raise SBDError(f"--proxy {args.proxy} does not apply to anchored SBD, which reveals by entropy"
                       + (" (the sbd row of --compare runs anchored on this drafter)" if not args.anchor else ""))
    methods = ["ntp", "sbd", "sbd-verify"] if args.compare else [args.method]
    if anchored is None:  # --compare on masks never trained: no plain SBD row (`_compare_sbd_row` said why)
        methods.remove("sbd")
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, stop=args.stop,
              chat=args.chat)
    eb = dict(gamma=args.gamma, proxy=args.proxy)  # the EB rule's settings: method sbd, sbd-verify's draft eb
    results = {}
    for method in methods:
        # one method takes every option given (the decoding spec refuses what it does not read); with --compare
        # each row takes those it reads: --block-size sbd and sbd-verify, the drafting options sbd-verify
        mkw, alone = dict(kw), not args.compare
        if alone or method != "ntp":
            mkw["block_size"] = args.block_size
        if alone or method == "sbd" or (method == "sbd-verify" and args.draft == "eb"):
            mkw.update(eb)
        if alone or method == "sbd-verify":
            mkw.update(drafting_kwargs(args))
        if anchored and method == "sbd":
            mkw["anchor"] = True
        label = "sbd anchored (lossy)" if anchored and method == "sbd" and not args.anchor else method
        generate(model, tokenizer, args.prompts, method=method, **{**mkw, "max_new_tokens": 2})  # warm-up
        results[label] = generate(model, tokenizer, args.prompts, method=method, **mkw)
    # stdout carries the answers only (`sbd generate ... > answer.txt`): one answer alone; several under a
    # `=== prompt` / `--- method` label each. The statistics go to stderr.
    labelled = len(args.prompts) > 1 or len(results) > 1
    for i, prompt in enumerate(args.prompts):
        if len(args.prompts) > 1:
            print(f"=== prompt {i + 1}: {prompt!r}")
        for method, r in results.items():
            if labelled:
                print(f"--- {method}")
            print(r.texts[i], flush=True)
    from ..models.quantized import held_weights

    stats = {m.upper(): _stats(r, held_weights(model)) for m, r in results.items()}
    if len(args.prompts) > 1:
        for s, r in zip(stats.values(), results.values()):
            s["NFE per prompt"] = ", ".join(map(str, r.nfe))
    keys = list(next(iter(stats.values())))
    keys += [k for s in stats.values() for k in s if k not in keys]
    print(file=sys.stderr)
    print_table(["", *stats], [[k, *(s.get(k, "–") for s in stats.values())] for k in keys], stderr=True)
    if args.compare:
        ntp = results["ntp"]
        for method, r in results.items():
            if method == "ntp":
                continue
            print(f"{method} vs NTP (the same model, one run each after warm-up): NFE speedup "
                  f"{sum(ntp.nfe) / max(1, sum(r.nfe)):.2f}x, wall-clock speedup {ntp.seconds / r.seconds:.2f}x"
                  + (f"; same tokens as NTP: {r.token_ids == ntp.token_ids}" if method == "sbd-verify" else ""),
                  file=sys.stderr)


def _unread_options(args) -> None:
    """`sbd generate`'s options that the chosen decoding would not read: one line naming them, before the
    model loads (the decoding spec's checks that need no model)."""
    from ..decoding.spec import DecodeSpec

    if args.compare:  # --gamma and --proxy go to the sbd row, --block-size to sbd and sbd-verify, drafting to sbd-verify
        if args.anchor:
            return
        DecodeSpec.check(temperature=args.temperature, max_new_tokens=args.max_new_tokens, stop=args.stop)
        return
    DecodeSpec.check(method=args.method, anchor=args.anchor or None, gamma=args.gamma, proxy=args.proxy,
                     block_size=args.block_size, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                     stop=args.stop, **drafting_kwargs(args))


def _compare_sbd_row(model, args):
    """How `--compare` runs its plain-SBD row on this model: False the paper's rule, True anchored on the
    model's next token (a drafter trained for sbd-verify's drafts only, which plain SBD would derail), None
    left out (masks never trained); a line on stderr says which and why."""
    from ..decoding.trained_for import check_decoding

    try:
        check_decoding(model, "sbd")
        return False
    except SBDError:
        pass
    try:
        check_decoding(model, "sbd", anchor=True)
    except SBDError:
        print("sbd: --compare: this model's masks were never trained (it records next-token decoding only), so the "
              "sbd row is left out: plain SBD would reveal their untrained guesses, with --anchor or without",
              file=sys.stderr)
        return None
    print("sbd: --compare: this drafter was not trained for plain SBD, so the sbd row runs anchored on the model's "
          "next token instead (as --method sbd --anchor does; lossy: not always the model's own answers)",
          file=sys.stderr)
    return True


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lm-eval"]:  # the harness parses its own arguments
        return _guarded(run_lm_eval, argv[1:])
    engine_args = []
    if argv[:1] == ["serve"] and "--" in argv:  # `sbd serve --engine vllm ... -- VLLM OPTIONS`
        at = argv.index("--")
        argv, engine_args = argv[:at], argv[at + 1:]
    args = build_parser().parse_args(argv)
    args.engine_args = engine_args
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # ours show progress; theirs would print one bar per file written
    command = {"init": cmd_init, "generate": cmd_generate, "train": cmd_train, "eval": cmd_eval,
               "experiment": cmd_experiment, "demo": cmd_demo, "bench": cmd_bench, "forward-cost": cmd_forward_cost,
               "roofline": cmd_roofline, "import": cmd_import, "convergence": cmd_convergence, "distill": cmd_distill,
               "serve": cmd_serve, "vllm-setup": cmd_vllm_setup}[args.command]
    return _guarded(command, args)


def _guarded(command, args) -> int:
    """Run a command; a user's mistake (SBDError) is one line on stderr and exit status 2."""
    try:
        command(args)
    except SBDError as e:
        if interrupts.interrupted():  # e.g. a model load that a Ctrl-C cut short, reported as a load error
            print("sbd: interrupted", file=sys.stderr)
            return interrupts.STATUS
        from ..decoding.spec import SpecError

        # a refused decoding setting, named as this command line writes it (lm-eval's model_args: as Python)
        cli = isinstance(e, SpecError) and command is not run_lm_eval
        print(f"sbd: error: {e.spelled('cli') if cli else e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        interrupts.leaving()  # a further Ctrl-C from here on ends the process at once, with the same status
        print("sbd: interrupted", file=sys.stderr)
        return interrupts.STATUS
    return 0


if __name__ == "__main__":
    sys.exit(main())
