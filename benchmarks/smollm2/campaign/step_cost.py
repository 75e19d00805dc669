"""The self-distillation campaign's cheaper steps: the drafting adapter's training step, today's
against the cheaper variants, on the campaign's own answers. One process, variants interleaved round by
round on the same sequences.

A step is timed whole: batch construction, both forwards, loss (masked CE + KL, as the shipped adapter
trained), backward and AdamW. Reported per sequence and per trained target, medians over rounds.

- today: the two-pass forward as it was before this change (dense mask in the clean half, whole noisy copy)
- causal: the clean half through SDPA's causal kernel, cut after the last position the noisy half reads
- blocks4: + the noisy copy holds 4 drawn blocks (`--noisy-blocks 4`)
- upper: + autograd only from layer 15 of 30 up (`--train-layers-from 15`)
- cheap: `upper` on batches of similar length (`--group-by-length`: 8 neighbours in length order),
  against `today` on random batches: what a user of both option sets gets per sequence
- bf16 (`--variants ...,bf16`): `causal` under bf16 autocast; cheap_bf16: `cheap` under bf16 autocast
  (pays only on a CPU with AVX-512 BF16 or AMX; elsewhere bf16 is emulated and many times slower)

The padding that `--group-by-length` removes is also counted exactly over the whole data: clean tokens
computed (batch × longest) per real token, random batches against length-grouped ones.

    python benchmarks/smollm2/campaign/step_cost.py --data runs/campaign/distill.jsonl --rounds 4 \
        --out benchmarks/smollm2/campaign/results/step_cost.md
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch


def old_two_pass(model, inputs, labels, n, source):
    """Today's forward before this change (kept here as the A/B reference): dense mask, whole clean half."""
    from transformers import DynamicCache

    from sbd.drafters.adapter import gated
    from sbd.models.cache_arg import with_cache
    from sbd.training.adapter_forward import AdapterOutputs, _backbone
    from sbd.training.collator import IGNORE

    ids, pos, mask = inputs["input_ids"], inputs["position_ids"], inputs["attention_mask"]
    keep = labels[:, n:] != IGNORE
    cache = DynamicCache()
    with torch.no_grad(), gated(model, None):
        hidden = _backbone(model)(input_ids=ids[:, :n], position_ids=pos[:, :n], attention_mask=mask[:, :, :n, :n],
                                  **with_cache(_backbone(model), cache), use_cache=True).last_hidden_state
        src = source[keep]
        rows = keep.nonzero()[:, 0]
        base = model.get_output_embeddings()(hidden[rows, (src - 1).clamp_min(0)])
    with gated(model, 0):
        logits = model(input_ids=ids[:, n:], position_ids=pos[:, n:], attention_mask=mask[:, :, n:, :],
                       **with_cache(model, cache), use_cache=True, logits_to_keep=keep).logits
    return AdapterOutputs(logits, base, src >= 1)


VARIANTS = {  # name: (forward, group by length, noisy blocks, grad layer, bf16)
    "today": ("old", False, None, 0, False),
    "causal": ("new", False, None, 0, False),
    "blocks4": ("new", False, 4, 0, False),
    "upper": ("new", False, 4, 15, False),
    "cheap": ("new", True, 4, 15, False),
    "bf16": ("new", False, None, 0, True),
    "cheap_bf16": ("new", True, 4, 15, True),
}
TWINS = {"bf16": "causal", "cheap_bf16": "cheap"}  # a bf16 variant's float32 twin: gradients compared when both run
DEFAULT_VARIANTS = "today,causal,blocks4,upper,cheap"


def padding_ratio(lengths: list[int], batch: int, grouped: bool, seed: int = 0) -> float:
    """Tokens computed (batch × the batch's longest) per real token over one pass of the data."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__) if grouped else list(range(len(lengths)))
    if not grouped:
        random.Random(seed).shuffle(order)
    computed = sum(len(order[i : i + batch]) * max(lengths[j] for j in order[i : i + batch])
                   for i in range(0, len(order), batch))
    return computed / sum(lengths)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="sbd distill records (the campaign's answers)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)


    import sbd
    from sbd.drafters import adapter as adapters
    from sbd.training.adapter_forward import adapter_logits, freeze_below, kl_sum
    from sbd.training.collator import IGNORE, SBDDataCollator
    from sbd.training.data import load_records, tokenize_records
    from sbd.training.loss import sbd_loss

    model, tok = sbd.load("smollm2")  # the shipped adapter: the campaign's warm start
    model.requires_grad_(False)
    model.train()
    start = {k: v.clone() for k, v in adapters.adapter_of(model).state_dict().items()}
    data = tokenize_records(load_records(args.data), tok, 4096, tok.mask_token_id)
    order = sorted(range(len(data)), key=lambda i: len(data[i]["input_ids"]))
    rng = random.Random(0)
    names = args.variants.split(",")
    times = {v: [] for v in names}
    per_target = {v: [] for v in names}
    k = args.block_size
    cosines = {v: [] for v in names}
    loss_ratio = {v: [] for v in names}
    for r in range(args.warmup + args.rounds):
        grads, losses = {}, {}
        plain = rng.sample(range(len(data)), args.batch)
        at = rng.randrange(len(order) - args.batch)
        grouped = order[at : at + args.batch]
        for name in names:
            fwd, group, blocks, layer, bf16 = VARIANTS[name]
            ad = adapters.adapter_of(model)
            ad.load_state_dict(start)
            ad.requires_grad_(True)
            if layer:
                freeze_below(model, layer)
            opt = torch.optim.AdamW([p for p in ad.parameters() if p.requires_grad], lr=1e-4)
            col = SBDDataCollator(tok, block_size=k, align_to_completion=True, mask_rate=1.0, noisy_blocks=blocks)
            g = torch.Generator().manual_seed(r)
            t0 = time.perf_counter()
            clean = col.pad([data[i] for i in (grouped if group else plain)])
            m = col.noisy_length(clean, k)
            eta, u = col.draw_noise(args.batch, m, g)
            windows = col.draw_windows(args.batch, col.block_count(clean, k), g)
            b = col.corrupt(clean, k, eta, u, windows=windows)
            labels, n = b.pop("labels"), b.pop("num_clean")
            labels[:, :n] = IGNORE
            source = col.sources(clean, k, windows)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = (old_two_pass(model, b, labels, n, source) if fwd == "old"
                       else adapter_logits(model, b, labels, n, source, grad_layer=layer))
            parts = sbd_loss(out.logits, labels, n)
            loss = parts.loss + kl_sum(out.logits, out.base_logits, out.kl_valid) / parts.matp_count.clamp_min(1)
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0  # the comparison below is outside the timed step
            if name in TWINS.values() or name in TWINS:  # .grad is still this step's after opt.step()
                grads[name] = torch.cat([p.grad.flatten() for p in ad.parameters() if p.grad is not None])
                losses[name] = loss.item()
            twin = TWINS.get(name)
            if r >= args.warmup and twin in grads:  # same batch, noise and start: the bf16 step against float32's
                cosines[name].append(torch.nn.functional.cosine_similarity(grads[name], grads[twin], dim=0).item())
                loss_ratio[name].append(loss.item() / losses[twin])
            opt.zero_grad(set_to_none=True)
            if r >= args.warmup:
                times[name].append(dt / args.batch)
                per_target[name].append(dt / max(1, int(parts.matp_count)))
            print(f"round {r} {name}: {dt:.2f} s, {int(parts.matp_count)} targets, clean {n}, noisy {m}", flush=True)
    lengths = [len(d["input_ids"]) for d in data]
    pad_random, pad_grouped = padding_ratio(lengths, args.batch, False), padding_ratio(lengths, args.batch, True)
    med = {v: statistics.median(times[v]) for v in names}
    med_t = {v: statistics.median(per_target[v]) for v in names}
    base = med["today"] if "today" in med else None
    lines = [f"Adapter training step on SmolLM2-135M-Instruct (shipped adapter as the start, rank 16, all 7 "
             f"projections), the campaign's answers ({len(data)}), batch {args.batch}, block {k}, every block "
             f"position masked, masked CE + KL; {platform.machine()} {args.threads} threads, torch {torch.__version__}; "
             f"medians of {args.rounds} interleaved rounds after {args.warmup} warm-up.", "",
             "| variant | s / sequence | ms / target | sequences per CPU-hour | vs today (per sequence) |",
             "|---|---:|---:|---:|---:|"]
    for v in names:
        ratio = f"{base / med[v]:.2f}x cheaper" if base else "-"
        lines.append(f"| {v} | {med[v]:.2f} | {1000 * med_t[v]:.1f} | {3600 / med[v]:.0f} | {ratio} |")
    for v in names:
        if cosines[v]:
            lines += ["", f"{v} against {TWINS[v]} on the same batches and start (float32): gradient cosine "
                      f"min {min(cosines[v]):.4f} / median {statistics.median(cosines[v]):.4f}; loss ratio "
                      f"{min(loss_ratio[v]):.4f}–{max(loss_ratio[v]):.4f} over {len(cosines[v])} rounds."]
    lines += ["", f"Padding in the clean half over all {len(data)} sequences at batch {args.batch}: "
              f"{pad_random:.2f} tokens computed per real token with random batches, {pad_grouped:.2f} grouped by "
              f"length ({pad_random / pad_grouped:.2f}x less)."]
    text = "\n".join(lines)
    print(text)
    if args.out:
        cmd = "python benchmarks/smollm2/campaign/step_cost.py " + " ".join(
            f"--{a.replace('_', '-')} {v}" for a, v in vars(args).items() if v is not None and a != "out")
        with open(args.out, "w") as f:
            f.write(text + f"\n\nCommand: `{cmd}`\n")


if __name__ == "__main__":
    main()
