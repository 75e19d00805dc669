"""Training step time and peak memory: `--mode sbd` vs `--mode ntp` at the same L and batch.

Configurations are timed interleaved in one process (a slow spell of a shared machine hits all
alike); peak memory comes from a separate process per configuration. A step is timed whole: batch
construction (mask, labels), forward, loss, backward and AdamW, after warm-up. The forward is
`sbd.training.attention.training_logits`, what SBDTrainer uses (`--plain`: the plain forward with full
logits and dense-mask SDPA; `--compare`: both, interleaved). The SBD step feeds 2L tokens, so ~2x the
NTP step is the natural cost; the target is <= 2.2x.

    python benchmarks/train_step.py --seq-len 256 --batch 8 --steps 10
    python benchmarks/train_step.py --seq-len 256 --batch 8 --steps 10 --compare
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch


CONFIGS = ("ntp", "sbd", "sbd-aligned")
PLAIN_CONFIGS = ("ntp-plain", "sbd-plain")  # --compare: the plain forward, interleaved with the fast one


def _peak_rss() -> int:
    """Peak resident memory of this process (VmHWM; ru_maxrss would carry the parent's over exec)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(args, configs, warmup: int, steps: int) -> dict:
    """Interleaved timing: one step of each configuration in turn, so that a slow spell of a shared
    machine hits every configuration alike; medians per configuration."""
    from sbd.models import tiny
    from sbd.training.collator import SBDDataCollator
    from sbd.training.attention import training_logits
    from sbd.training.loss import sbd_loss

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = tiny.tiny_config("llama", vocab_size=args.vocab, hidden=args.hidden, layers=args.layers,
                           heads=args.heads, kv_heads=args.heads // 2, context=2 * args.seq_len)
    model = tiny.random_model(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, args.vocab, (args.seq_len,), generator=g).tolist() for _ in range(args.batch)]
    setups = {}
    for config in configs:
        aligned = config.startswith("sbd-aligned")
        setups[config] = (SBDDataCollator(mask_token_id=2, eos_token_id=0, align_to_completion=aligned),
                          [{"input_ids": x, "prompt_length": args.seq_len // 2 if aligned else 0} for x in ids])
    times = {c: [] for c in configs}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(warmup + steps):
        for config in configs:
            collator, feats = setups[config]
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            clean = {k: v.to(device) for k, v in collator.pad(feats).items()}
            ntp, plain = config.startswith("ntp"), args.plain or config.endswith("-plain")
            if ntp:
                batch = collator.causal(clean)
            else:
                eta, u = collator.draw_noise(args.batch, collator.noisy_length(clean), g)
                batch = collator.corrupt(clean, 2 + step % 15, eta, u)
            labels, num_clean = batch.pop("labels"), batch.pop("num_clean")
            logits = training_logits(model, batch, labels, None if ntp else num_clean,
                                     split=not plain, labelled_only=not plain)
            loss = sbd_loss(logits, labels, num_clean).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            if step >= warmup:
                times[config].append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else _peak_rss()
    return {"device": device, "peak_bytes": peak, "tokens": args.batch * args.seq_len,
            "median_s": {c: statistics.median(t) for c, t in times.items() if t},
            "spread_s": {c: [min(t), max(t)] for c, t in times.items() if t}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--plain", action="store_true",
                   help="the plain forward (full logits, dense-mask SDPA): the step before sbd/training/attention.py")
    p.add_argument("--compare", action="store_true",
                   help="also time the plain forward (ntp-plain, sbd-plain) interleaved with the fast one")
    p.add_argument("--no-memory", action="store_true",
                   help="skip the peak-memory processes (one per configuration): timings only")
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)  # internal: one configuration
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.config:  # peak memory of one configuration alone, in its own process
        print(json.dumps(run(args, [args.config], warmup=1, steps=1)))
        return
    configs = CONFIGS + (PLAIN_CONFIGS if args.compare else ())
    timed = run(args, configs, args.warmup, args.steps)
    peaks = {}
    for config in configs if not args.no_memory else ():
        cmd = [sys.executable, __file__, *sys.argv[1:], "--config", config]
        peaks[config] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["peak_bytes"]
    ref = {c: "ntp-plain" if c.endswith("-plain") else "ntp" for c in configs}
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, device {timed['device']}")
    print(f"L={args.seq_len} batch={args.batch} hidden={args.hidden} layers={args.layers} vocab={args.vocab} "
          f"steps={args.steps} (after {args.warmup} warm-up), forward: {'plain' if args.plain else 'fast'}")
    print("| mode | median step (s) | min-max (s) | vs ntp, medians | vs ntp, minima | tokens/s | peak memory (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for name in configs:  # "vs ntp": against the NTP step with the same forward (fast or plain)
        med, (lo, hi) = timed["median_s"][name], timed["spread_s"][name]
        peak = f"{peaks[name] / 2**20:.0f}" if name in peaks else "–"
        print(f"| {name} | {med:.4f} | {lo:.3f}-{hi:.3f} | {med / timed['median_s'][ref[name]]:.2f}x | "
              f"{lo / timed['spread_s'][ref[name]][0]:.2f}x | {timed['tokens'] / med:.0f} | {peak} |")


if __name__ == "__main__":
    main()
