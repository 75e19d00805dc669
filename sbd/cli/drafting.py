"""The drafting options of sbd-verify, declared once for `sbd generate`, `sbd serve` and `sbd lm-eval`:
each left out means the model's measured default (`sbd.decoding.defaults`), and each can switch its
lever off (`--draft block`, `--no-lookup`, `--tree chain`)."""

from __future__ import annotations

import argparse

from .args import positive_int

DEFAULT_NOTE = ("default: the fastest exact greedy configuration measured for the model, which its adapter "
                "or config records (`sbd generate` prints the one it ran with); else ")


def add_drafting_options(p, server: bool = False) -> None:
    """--draft, --lookup/--no-lookup, --lookup-max and --tree, with help that says what each default is;
    for `sbd serve` they are the defaults of requests that leave them out."""
    who = "requests' default (a request may set its own), sbd-verify" if server else "sbd-verify"
    p.add_argument("--draft", default=None, choices=["block", "eb", "adaptive"],
                   help=f"{who} only: block = the whole block the masked head predicts, in the verifying "
                        "forward; eb = revealed by the EB rule (--gamma, --proxy) over forwards of its own, greedy "
                        "only; adaptive = each row picks its draft length (<= block size) from its acceptance so far "
                        "and the measured cost of a wider forward, and ends a draft of its masks before a place they "
                        f"are unsure of, greedy only ({DEFAULT_NOTE}block; with "
                        "sampling: block)")
    p.add_argument("--lookup", default=None, action=argparse.BooleanOptionalAction,
                   help=f"{who}, greedy, --draft block or adaptive: draft what followed the last 3 (else 2) tokens "
                        "where they occurred earlier in the prompt or output (prompt lookup), else the masks' "
                        f"draft; the output is still NTP's; --no-lookup turns it off ({DEFAULT_NOTE}off)")
    p.add_argument("--lookup-max", type=positive_int, default=None, metavar="N",
                   help="with lookup: the longest lookup draft, independent of --block-size; the draft runs as "
                        "long as the earlier occurrence goes on, up to N tokens, and is verified without masks "
                        f"beside it ({DEFAULT_NOTE}16)")
    p.add_argument("--tree", default=None, metavar="WIDTHS",
                   help=f"{who}, greedy, --draft block or adaptive: tree drafts with these widths per depth, e.g. "
                        "3,2,1 (depth 1: the masks' 3 most likely tokens, depth 2: the 2 most likely extensions, "
                        "…; the chain goes on past them); each forward keeps the longest path greedy decoding "
                        f"would produce, so the output is still NTP's; 'chain' turns trees off ({DEFAULT_NOTE}"
                        "a chain)")


def drafting_kwargs(args) -> dict:
    """The drafting options a user gave, as `generate` keywords (left-out ones stay out: the defaults)."""
    given = {"draft": args.draft, "lookup": args.lookup, "lookup_max": args.lookup_max, "tree": args.tree}
    return {k: v for k, v in given.items() if v is not None}
