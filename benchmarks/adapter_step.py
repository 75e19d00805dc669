"""Training step time of the drafting adapter against the full-weight SBD step and the NTP step, on one
model (e.g. the imported SmolLM2-135M) at the same batch: interleaved in one process, medians after
warm-up. A step is timed whole: batch construction, forward, loss, backward and AdamW.

- ntp: the plain next-token step over all weights;
- sbd: the paper's step over all weights (doubled sequence, NTP + masked loss; the fast forward SBDTrainer uses);
- adapter: the frozen model with a rank-R drafting adapter, masked loss only (+KL), the clean half
  computed without autograd (sbd/training/adapter_forward.py).

    python benchmarks/adapter_step.py --model runs/smollm2/base --data runs/smollm2/distill_train.jsonl \
        --batch 4 --steps 5 --out benchmarks/results/adapter_step.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="jsonl records (sbd distill output or prompt/completion)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the Markdown table here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import sbd
    from sbd.drafters import adapter as adapters
    from sbd.training.adapter_forward import adapter_logits, kl_sum
    from sbd.training.attention import training_logits
    from sbd.training.collator import IGNORE, SBDDataCollator
    from sbd.training.data import load_records, tokenize_records
    from sbd.training.loss import sbd_loss

    full, tok = sbd.load(args.model, weights="float")
    frozen, _ = sbd.load(args.model, weights="float")
    frozen.requires_grad_(False)
    adapters.attach(frozen, adapters.AdapterConfig(r=args.rank))
    data = tokenize_records(load_records(args.data), tok, 512, tok.mask_token_id)
    collator = SBDDataCollator(tok, block_size=args.block_size, align_to_completion=True, mask_rate=1.0)
    g = torch.Generator().manual_seed(0)
    batches = [collator.pad([data[(i * args.batch + j) % len(data)] for j in range(args.batch)])
               for i in range(args.warmup + args.steps)]
    opts = {"ntp": torch.optim.AdamW(full.parameters(), lr=1e-5), "sbd": None,
            "adapter": torch.optim.AdamW([p for p in frozen.parameters() if p.requires_grad], lr=1e-4)}
    opts["sbd"] = opts["ntp"]
    full.train()
    frozen.train()

    def step(kind, clean):
        if kind == "ntp":
            b = collator.causal(clean)
            labels, n = b.pop("labels"), b.pop("num_clean")
            logits = training_logits(full, b, labels, None)
            loss = sbd_loss(logits, labels, n).loss
        else:
            m = collator.noisy_length(clean, args.block_size)
            eta, u = collator.draw_noise(args.batch, m, g)
            b = collator.corrupt(clean, args.block_size, eta, u)
            labels, n = b.pop("labels"), b.pop("num_clean")
            if kind == "sbd":
                loss = sbd_loss(training_logits(full, b, labels, n), labels, n).loss
            else:
                labels[:, :n] = IGNORE
                origin = clean["prompt_lengths"]
                j = torch.arange(m)
                src = torch.where(j[None] < (clean["lengths"] - origin)[:, None], origin[:, None] + j[None], -1)
                out = adapter_logits(frozen, b, labels, n, src)
                parts = sbd_loss(out.logits, labels, n)
                loss = parts.loss + kl_sum(out.logits, out.base_logits, out.kl_valid) / parts.matp_count.clamp_min(1)
        loss.backward()
        opts[kind].step()
        opts[kind].zero_grad(set_to_none=True)

    kinds = ("ntp", "sbd", "adapter")
    times = {k: [] for k in kinds}
    for i, clean in enumerate(batches):
        for kind in kinds:
            start = time.perf_counter()
            step(kind, clean)
            if i >= args.warmup:
                times[kind].append(time.perf_counter() - start)
    tokens = statistics.mean(int(c["lengths"].sum()) for c in batches)
    med = {k: statistics.median(v) for k, v in times.items()}
    trainable = sum(p.numel() for p in frozen.parameters() if p.requires_grad)
    lines = [f"Training step, {args.model}, batch {args.batch} (mean {tokens:.0f} tokens per batch), block "
             f"{args.block_size}, every block position masked, rank {args.rank} adapter ({trainable / 1e6:.2f}M "
             f"trainable), {platform.processor() or platform.machine()}, {args.threads} threads, torch "
             f"{torch.__version__}; medians of {args.steps} interleaved steps after {args.warmup} warm-up.", "",
             "| step | seconds | tokens/s | vs NTP step |", "|---|---:|---:|---:|"]
    for k in kinds:
        lines.append(f"| {k} | {med[k]:.2f} | {tokens / med[k]:.0f} | {med[k] / med['ntp']:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n\nCommand: `python benchmarks/adapter_step.py " +
                    " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "out")
                    + "`\n")


if __name__ == "__main__":
    main()
