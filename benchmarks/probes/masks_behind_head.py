"""Probe, forwards only: masks fed behind the head as well as behind the draft. How many forwards would it save?

Why: in sbd-verify the masks ride behind the whole draft. When any draft token is refused they drafted for
the wrong places, and the next forward has no draft (on SmolLM2 with its adapter, 327 of 653 forwards of
whole-block drafts: benchmarks/results/confidence_cut/drafter_calibration.md). This probe adds `b` more
masks hanging from the head (they see the cache and the head only). After a refusal at draft place a,
the masks behind the head have predicted the places after it in the right context (up to the places
they cannot know), so the next forward drafts masks_B[a + 1:] instead of nothing.

The layout rides on the engine's tree feeds (`Feed.parents`): the head, then the `b` masks as a causal
branch from the head, then the draft as the main chain, then the usual block of masks after it. The
masks behind the head therefore attend causally to each other rather than as one bidirectional block (the
training layout): this under-estimates what a real second block would draft. The draft is still verified
by the next-token head, so the answers must stay the model's greedy answers; the probe checks them
against our NTP loop. Not a library feature: it replaces `VerifyRow` in this process only.

With a sampler head, the chain behind the head for a refusal at the first draft place is the head's own
(its table over those masks, after the next-token head's token); later places take the masks' argmax.

    python benchmarks/probes/masks_behind_head.py --n 12 --behind 0,4,8             # whole blocks
    python benchmarks/probes/masks_behind_head.py --n 12 --behind 0,4 --no-head     # no sampler head
    python benchmarks/probes/masks_behind_head.py --n 12 --behind 0,2,4 --defaults  # the defaults, timed
    python benchmarks/probes/masks_behind_head.py --model demo --behind 0,4,8       # the demo model

Results: benchmarks/probes/results/masks_behind_head.md.
"""

from __future__ import annotations

import argparse
import time

import torch

from sbd.decoding import rows
from sbd.decoding.forward import Feed

Base = rows.VerifyRow
SETTINGS = {"behind": 0}
COUNTS = {"no draft": 0}
EXTRA_GATED: set[int] = set()  # batch 1: feed columns of the masks behind the head, which the adapter must see


def gate_the_masks_behind_the_head(model) -> None:
    """The drafting adapter acts on the block after a row's committed part (`sbd.drafters.adapter`, a start column).
    The masks behind the head sit in the committed part here, so the gate gets their columns too: every
    start becomes a per-row tensor, and the per-row gate ORs in `EXTRA_GATED`."""
    from sbd.drafters import adapter as adapters

    base_gate = adapters._row_gate

    def row_gate(starts, output):
        gate = base_gate(starts, output)
        if EXTRA_GATED:
            cols = torch.tensor(sorted(EXTRA_GATED), device=output.device)
            gate = gate.clone()
            gate[:, cols] = 1
        return gate
    adapters._row_gate = row_gate
    a = adapters.adapter_of(model)

    class PerRowStart(type(a)):
        @property
        def start(self):
            return self.__dict__.get("_start")

        @start.setter
        def start(self, value):
            self.__dict__["_start"] = torch.tensor([value]) if isinstance(value, int) else value
    a.__class__ = PerRowStart


class MasksBehindHead(Base):
    """Whole-block chain drafts (greedy, no lookup, no tree) with `SETTINGS["behind"]` masks behind the head."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.b = SETTINGS["behind"]
        self.needs_extra += self.b
        self._layout = None

    def feed(self) -> Feed:
        EXTRA_GATED.clear()
        if not self.in_prefill:
            self.draft = self.draft[: max(0, self.max_new - len(self.out) - 1)]  # the budget's room
        COUNTS["no draft"] += not self.in_prefill and not self.draft
        if self.in_prefill or not self.draft or not self.b or self.tree is not None or self.from_lookup:
            self._layout = None
            return super().feed()
        k, b, m = len(self.draft), self.b, self.n_masks
        tokens = [self.head] + [self.mask_id] * b + self.draft
        parents = [-1] + [j for j in range(b)] + [0] + [1 + b + i for i in range(k - 1)]
        self._layout = (k, b)
        EXTRA_GATED.update(range(1, 1 + b))  # batch 1: no padding, the row's columns are its feed's
        return Feed(tokens + [self.mask_id] * m, len(tokens), len(tokens) + m, parents)

    def ask(self, logits, drafting=None):
        if self._layout is None:
            return super().ask(logits, drafting)
        k, b = self._layout
        n = 1 + b + k
        ntp, masks = logits[:n], logits[n:]
        behind = logits[1 : 1 + b].clone()
        behind[:, self.mask_id] = torch.finfo(behind.dtype).min
        masks[:, self.mask_id] = torch.finfo(masks.dtype).min
        nxt = ntp.argmax(-1)
        # with a sampler head, the chain behind the head for a refusal at the first draft place, where the
        # head's own token nxt[0] takes place 1: the head's table over masks 2.. of the branch
        table = drafting.table(behind[1:], 2, nxt[0]) if drafting is not None and b > 1 else nxt[:0]
        self._table_n = table.numel()
        return torch.cat([nxt.double(), behind.argmax(-1).double(), table.double(),
                          self._chain_values(masks[1:], drafting, n + 1, nxt[-1])])

    def answer(self, values):
        if self._layout is None:
            return super().answer(values)
        k, b = self._layout
        self._layout = None
        n = 1 + b + k
        self.nfe += 1
        nxt = [int(v) for v in values[:n]]
        behind = [int(v) for v in values[n : n + b]]
        t = self._table_n
        behind_head = rows.walk(values[n + b : n + b + t], b - 1) if t else None
        chain = self._read_chain(values[n + b + t :])
        at = [0] + [1 + b + i for i in range(k)]  # feed positions of the head and the draft
        a = 0
        while a < k and self.draft[a] == nxt[at[a]]:
            a += 1
        new = self.draft[:a] + [nxt[at[a]]]
        self.accepted.append(a)
        self.proposed += k
        self._record(a, a < k)
        self._adapt()
        start = self._take(new)
        end = self._end(start, new)
        keep = at[: a + 1]
        if end is not None:
            self._finish(end)
            return keep
        self.head = new[-1]
        if a == k:
            self._next_draft(chain)
        elif a == 0 and behind_head is not None:  # refused at once: the head's chain over the masks behind it
            self._next_draft(behind_head)
        else:  # refused at draft place a: the masks behind the head drafted places a + 2, … in context
            self._next_draft(behind[a + 1 :])
        return keep


def one_pass(model, tok, prompts, want, behind: int, **kw) -> tuple[int, int, int, int, float]:
    """Every prompt alone with `behind` masks behind the head: (forwards, tokens, answers the same as
    `want`, forwards with no draft, seconds)."""
    import sbd

    SETTINGS["behind"] = behind
    COUNTS["no draft"] = 0
    nfe = tokens = same = 0
    t = time.perf_counter()
    for p, w in zip(prompts, want):
        r = sbd.generate(model, tok, [p], method="sbd-verify", **kw)
        nfe, tokens, same = nfe + r.nfe[0], tokens + len(r.token_ids[0]), same + (r.token_ids[0] == w)
    return nfe, tokens, same, COUNTS["no draft"], time.perf_counter() - t


def row(label: str, nfe: int, tokens: int, same: int, empty: int, n: int, last: str) -> str:
    return f"| {label} | {tokens / nfe:.3f} | {nfe} | {empty} | {same}/{n} | {last} |"


def demo(args) -> None:
    """The demo model (fully fine-tuned: no adapter to gate, no sampler head), one pass per setting."""
    import sbd
    from sbd.tasks.prompts import load_prompts

    model, tok = sbd.load("demo", device=args.device)
    # the 90 held-out problems of `sbd bench --model demo --n 30`, as a file (no reasoning-gym needed)
    prompts = load_prompts("benchmarks/gpu/demo_prompts.jsonl")
    want = [sbd.generate(model, tok, [p], method="ntp", max_new_tokens=112).token_ids[0] for p in prompts]
    print("demo model, 90 problems, block 8\n\n| drafts | masks behind the head | tokens / forward | forwards "
          "| forwards with no draft | same as NTP | seconds |\n|---|---:|---:|---:|---:|---:|---:|")
    for draft in ("block", "adaptive"):
        for b in (int(x) for x in args.behind.split(",")):
            nfe, tokens, same, empty, seconds = one_pass(model, tok, prompts, want, b, block_size=8, draft=draft,
                                                         max_new_tokens=112)
            print(row(f"{draft} | {b}", nfe, tokens, same, empty, len(prompts), f"{seconds:.1f}"), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("smollm2", "demo"), default="smollm2",
                    help="demo: the 90 demo problems, whole blocks and adaptive drafts (no adapter, no head)")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--prompts", default="runs/campaign/eval24/heldout_gsm.jsonl")
    ap.add_argument("--behind", default="0,4,8", help="masks behind the head to try (0: today's layout)")
    ap.add_argument("--head", action=argparse.BooleanOptionalAction, default=True,
                    help="draft the main chain with the adapter's sampler head (as shipped)")
    ap.add_argument("--defaults", action="store_true",
                    help="the model's defaults (lookup, adaptive) instead of whole blocks, timed, interleaved")
    ap.add_argument("--device", default="cpu", help="demo: the device to run on (e.g. cuda)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import sbd
    from sbd.decoding.generate import encode_prompts
    from sbd.tasks.prompts import load_prompts

    rows.VerifyRow = MasksBehindHead  # make_row builds this class now
    if args.model == "demo":
        demo(args)
        return
    model, tok = sbd.load("smollm2", sampler_head=args.head)
    gate_the_masks_behind_the_head(model)
    prompts = encode_prompts(tok, load_prompts(args.prompts)[: args.n], chat=True)
    want = [sbd.generate(model, tok, [p], method="ntp", max_new_tokens=128).token_ids[0] for p in prompts]
    bs = [int(x) for x in args.behind.split(",")]
    header = ("| masks behind the head | tokens / forward | forwards | forwards with no draft | same as NTP | {} |\n"
              "|---:|---:|---:|---:|---:|---:|")
    if args.defaults:  # the shipped defaults (lookup, adaptive), settings taking turns on every prompt
        tot = {b: [0, 0, 0, 0, 0.0] for b in bs}
        sbd.generate(model, tok, [prompts[0]], method="sbd-verify", max_new_tokens=8)  # width costs
        for p, w in zip(prompts, want):
            for b in bs:
                got = one_pass(model, tok, [p], [w], b, max_new_tokens=128)
                tot[b] = [x + y for x, y in zip(tot[b], got)]
        print("\nthe defaults (lookup, else the head's chain, adaptive), interleaved\n\n" + header.format("time vs 0"))
        for b, (nfe, tokens, same, empty, seconds) in tot.items():
            print(row(str(b), nfe, tokens, same, empty, len(prompts), f"{seconds / tot[bs[0]][4]:.3f}"))
        return
    print(f"SmolLM2 + adapter{' and sampler head' if args.head else ''}, whole-block chains of 7, no lookup, "
          f"{args.n} prompts of {args.prompts}\n\n" + header.format("seconds"))
    for b in bs:
        nfe, tokens, same, empty, seconds = one_pass(model, tok, prompts, want, b, block_size=8, draft="block",
                                                     lookup=False, tree="chain", max_new_tokens=128)
        print(row(str(b), nfe, tokens, same, empty, len(prompts), f"{seconds:.0f}"), flush=True)


if __name__ == "__main__":
    main()
