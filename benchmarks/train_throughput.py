"""Training throughput: `sbd train` as users run it against a plain PyTorch NTP loop, tokens/s.

Both train the same model (the shipped demo model by default, or a random model of given shapes) on
the same batches: a generated jsonl of prompt/completion pairs (fixed seed), tokenized and batched by
`sbd train` itself; every padded batch its data loader produces is recorded and replayed, in the same
order, by the plain loop.

- `sbd train` is `sbd.training.run.train(TrainConfig(...))`, the library call behind the command, with
  the command's defaults (logging every 10 steps, progress bar off, checkpoints every 500 steps and at
  the end: after the last timed window). Recipes: `sbd` (the full SBD recipe), `sbd-before` (the same
  with this issue's changes switched off: every noisy block computed, `drop_unlabelled = False`; the
  loss read on the host every step, `sync_free = False` and the Trainer's `logging_nan_inf_filter`;
  buckets apply to CUDA's flex_attention only and stay), `ntp` (`--mode ntp`, the Trainer with the plain
  next-token loss: what the Trainer costs on its own), `adapter` (`--adapter lora`, the drafting
  adapter over the frozen model).
- the plain loop: the same model loaded with `sbd.load`, a fresh `torch.optim.AdamW` (lr 3e-4),
  `model(input_ids, attention_mask, labels)` (Hugging Face's shifted causal LM loss, completion tokens
  only, as `--mode ntp`), backward, gradient clipping at 1.0 (as the Trainer), step, zero_grad. No
  Trainer, no data loader, no logging. Under bf16 autocast on a GPU that has it (as the Trainer).

Tokens are counted the same way for both: the real (unpadded) tokens of each batch's clean sequence,
prompt + completion + EOS, i.e. `lengths.sum()`; SBD's doubled noisy copy is not counted, so a ratio of
0.5 is what the doubled sequence alone would explain.

Interleaved: a callback in the Trainer stops its clock every `--window` optimisation steps and runs
`--window` steps of the plain loop there, then restarts it; so the two alternate window by window in
one process, and a slow spell of a shared machine hits both alike. The first `--warmup` windows of
each are dropped; tokens/s are medians over the remaining windows (and over each window's steps).
A window of `sbd train` holds everything the Trainer does in those steps: data loading and padding,
the SBD corruption, the forward/backward/optimiser, callbacks and one log line.

    python benchmarks/train_throughput.py                               # demo model, sbd + ntp recipes
    python benchmarks/train_throughput.py --recipes sbd,ntp,adapter --windows 8
    python benchmarks/train_throughput.py --shape hidden=512,layers=8,heads=8,vocab=8192 --recipes sbd
    python benchmarks/train_throughput.py --quick                       # < 60 s on a 2-core CPU
    python benchmarks/train_throughput.py --device cuda                 # on a GPU machine

`--profile DIR` also writes a cProfile of `sbd train`'s timed windows (the plain loop's time excluded)
to DIR/<recipe>.prof and its top functions to DIR/<recipe>.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

RECIPES = ("sbd", "sbd-before", "ntp", "adapter")


def make_data(path: Path, n: int, seed: int) -> None:
    """n prompt/completion pairs of varied length: running sums of 2..12 numbers, worked step by step
    (about 20-120 tokens with the demo tokenizer)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            nums = [rng.randint(1, 999) for _ in range(rng.randint(2, 12))]
            total, steps = nums[0], []
            for x in nums[1:]:
                steps.append(f"{total} + {x} = {total + x}")
                total += x
            f.write(json.dumps({"prompt": "Add up: " + " + ".join(map(str, nums)) + "\n",
                                "completion": "\n".join(steps) + f"\nAnswer: {total}\n"}) + "\n")


def make_random_model(out: Path, shape: str) -> None:
    sizes = dict(hidden=256, layers=4, heads=4, vocab=1024)
    for part in filter(None, shape.split(",")):
        key, _, value = part.partition("=")
        if key not in sizes:
            raise SystemExit(f"--shape: unknown key {key!r} (use {', '.join(sizes)})")
        sizes[key] = int(value)
    from sbd.models import tiny

    texts = [json.loads(line)["prompt"] + json.loads(line)["completion"] for line in open(out.parent / "data.jsonl")]
    tiny.create(out, vocab_size=sizes["vocab"], texts=texts[:500], hidden=sizes["hidden"], layers=sizes["layers"],
                heads=sizes["heads"], kv_heads=sizes["heads"], context=1024)


class PlainLoop:
    """The plain PyTorch NTP loop over recorded clean batches."""

    def __init__(self, model_path: str, device: str, lr: float, seed: int):
        import torch

        from sbd.models.loading import load

        torch.manual_seed(seed)
        self.torch = torch
        self.device = device
        self.model, _ = load(model_path, device=device, dtype=torch.float32)
        self.model.train()
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=lr,
                                     weight_decay=0.0)
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                         if device == "cuda" and torch.cuda.is_bf16_supported() else contextlib.nullcontext())

    def step(self, clean: dict) -> int:
        torch = self.torch
        ids, lengths, prompt = clean["input_ids"], clean["lengths"], clean["prompt_lengths"]
        pos = torch.arange(ids.shape[1])[None]
        real = pos < lengths[:, None]
        labels = ids.masked_fill(~real | (pos < prompt[:, None]), -100)  # completion tokens (HF shifts)
        ids, labels, mask = ids.to(self.device), labels.to(self.device), real.long().to(self.device)
        with self.autocast:
            loss = self.model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return int(lengths.sum())


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def run_recipe(recipe: str, args, model_path: str, data: Path, work: Path) -> dict:
    """One `train(TrainConfig)` run of `recipe` with the plain loop interleaved window by window."""
    import torch
    from transformers import TrainerCallback

    from sbd.training import trainer as trainer_mod
    from sbd.training.run import TrainConfig, train

    plain = PlainLoop(model_path, args.device, args.lr, args.seed)
    recorded: deque = deque()
    tokens = {"sbd": 0}
    windows = {"sbd": [], "plain": []}  # (seconds, tokens) per window
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()

    class Interleave(TrainerCallback):
        def __init__(self):
            self.mark = None
            self.begun = False

        def on_step_begin(self, args_, state, control, **kw):
            if not self.begun:  # the clock starts at the first step (model, data and Trainer set up)
                self.begun = True
                sync(args.device)
                self.mark = time.perf_counter()
                tokens["sbd"] = 0
                if prof is not None:
                    prof.enable()

        def on_step_end(self, args_, state, control, **kw):
            if state.global_step % args.window:
                return control
            sync(args.device)
            now = time.perf_counter()
            if prof is not None:
                prof.disable()
            windows["sbd"].append((now - self.mark, tokens["sbd"]))
            t0, n = time.perf_counter(), 0
            for _ in range(args.window):
                n += plain.step(recorded.popleft())
            sync(args.device)
            windows["plain"].append((time.perf_counter() - t0, n))
            tokens["sbd"] = 0
            if prof is not None and len(windows["sbd"]) >= args.warmup:
                prof.enable()
            self.mark = time.perf_counter()
            return control

    original_init = trainer_mod.SBDTrainer.__init__

    def patched_init(self, *a, **kw):
        original_init(self, *a, **kw)
        pad = self.data_collator

        def recording_pad(features):
            batch = pad(features)
            recorded.append({k: v.clone() for k, v in batch.items()})
            return batch

        self.data_collator = recording_pad
        build = self.build_batch

        def counting(clean, step, micro=0):
            tokens["sbd"] += int(clean["lengths"].sum())  # the host batch, before it moves: no device read
            return build(clean, step, micro)

        self.build_batch = counting
        self.add_callback(Interleave())
        if recipe == "sbd-before":  # this changes off (what can be switched off)
            self.drop_unlabelled, self.sync_free = False, False
            self.args.logging_nan_inf_filter = True

    steps = args.window * (args.warmup + args.windows)
    config = TrainConfig(model=model_path, data=str(data), out=str(work / f"run_{recipe}"), steps=steps,
                         batch_size=args.batch_size, lr=args.lr, seed=args.seed, progress=False,
                         mode="ntp" if recipe == "ntp" else "sbd", adapter="lora" if recipe == "adapter" else None,
                         max_len=args.max_len)
    trainer_mod.SBDTrainer.__init__ = patched_init
    try:
        with contextlib.redirect_stdout(sys.stderr):
            train(config)
    finally:
        trainer_mod.SBDTrainer.__init__ = original_init
    result = {"recipe": recipe, "steps": steps}
    for who in ("sbd", "plain"):
        kept = windows[who][args.warmup:]
        result[who] = {"tokens_per_s": statistics.median(n / s for s, n in kept),
                       "step_s": statistics.median(s / args.window for s, _ in kept),
                       "tokens_per_step": statistics.mean(n / args.window for _, n in kept),
                       "windows": [[round(s, 4), n] for s, n in kept]}
    result["ratio"] = result["sbd"]["tokens_per_s"] / result["plain"]["tokens_per_s"]
    pooled = {who: sum(n for _, n in windows[who][args.warmup:]) / sum(s for s, _ in windows[who][args.warmup:])
              for who in ("sbd", "plain")}
    result["ratio_pooled"] = pooled["sbd"] / pooled["plain"]  # all timed windows' tokens over their time
    result["ratios"] = [(n1 / s1) / (n2 / s2) for (s1, n1), (s2, n2)
                        in zip(windows["sbd"][args.warmup:], windows["plain"][args.warmup:])]
    if prof is not None:
        import pstats

        Path(args.profile).mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(Path(args.profile) / f"{recipe}.prof"))
        with open(Path(args.profile) / f"{recipe}.txt", "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(40)
    del plain
    return result


def machine() -> dict:
    import torch

    name = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                name = line.split(":", 1)[1].strip()
    except OSError:
        pass
    info = {"cpu": name, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version()}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def report(results: list, info: dict, args, command: str) -> str:
    lines = ["# Training throughput: `sbd train` vs a plain PyTorch NTP loop", "",
             f"Command: `{command}`", "",
             f"Machine: {info['cpu']}" + (f", {info['gpu']}" if "gpu" in info else "") +
             f", {info['cores']} cores, {info['threads']} torch threads, torch {info['torch']}, "
             f"transformers {info.get('transformers', '?')}, device {args.device}.", "",
             f"Model: {args.model_label}. Data: {args.records} generated prompt/completion pairs (seed {args.seed}), "
             f"batch {args.batch_size}. Windows of {args.window} optimisation steps, `sbd train` and the plain loop "
             f"alternating window by window in one process; {args.warmup} warm-up window(s) of each dropped, medians "
             f"over {args.windows}. Tokens = the real (unpadded) tokens of the clean sequence of each batch, the same "
             "count for both (SBD's noisy copy is not counted: 0.50x is what the doubled sequence alone explains).", "",
             "| recipe | sbd train tokens/s | step (s) | plain loop tokens/s | step (s) | ratio (medians) | "
             "ratio (all windows pooled) | ratio per window, min-max | tokens/step |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in results:
        s, p = r["sbd"], r["plain"]
        lines.append(f"| {r['recipe']} | {s['tokens_per_s']:.0f} | {s['step_s']:.4f} | {p['tokens_per_s']:.0f} | "
                     f"{p['step_s']:.4f} | **{r['ratio']:.2f}x** | {r['ratio_pooled']:.2f}x | "
                     f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f} | "
                     f"{s['tokens_per_step']:.0f} |")
    lines += ["", "Goal: >= 0.45x for the sbd recipe (SBD trains on twice the tokens)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the shipped demo model sbd/demo_model/ntp)")
    p.add_argument("--shape", default=None,
                   help="a random model instead, e.g. hidden=512,layers=8,heads=8,vocab=8192 (sbd.models.tiny)")
    p.add_argument("--recipes", default="sbd,ntp", help=f"comma-separated, of {', '.join(RECIPES)}")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-len", type=int, default=None)
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--window", type=int, default=10, help="optimisation steps per window")
    p.add_argument("--windows", type=int, default=6, help="timed windows of each, after the warm-up")
    p.add_argument("--warmup", type=int, default=1, help="warm-up windows of each, dropped")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a small run (< 60 s on a 2-core CPU): sbd only, "
                   "windows of 4 steps, 1 warm-up + 3 timed, 400 records")
    p.add_argument("--profile", default=None, help="write a cProfile of sbd train's timed windows here")
    p.add_argument("--out", default=None, help="folder for train_throughput.md and .json")
    args = p.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # `sbd train` takes a GPU whenever one is visible
    if args.quick:
        args.recipes, args.window, args.windows, args.warmup = "sbd", 4, 3, 1
        args.records = min(args.records, 400)
    recipes = [r for r in args.recipes.split(",") if r]
    for r in recipes:
        if r not in RECIPES:
            raise SystemExit(f"unknown recipe {r!r}; choose from {', '.join(RECIPES)}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU here")
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    info = machine()
    command = "python benchmarks/train_throughput.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "data.jsonl"
        make_data(data, args.records, args.seed)
        if args.shape:
            model_path = str(work / "model")
            make_random_model(Path(model_path), args.shape)
            args.model_label = f"random Llama ({args.shape})"
        else:
            model_path = args.model or str(Path(__file__).resolve().parents[1] / "sbd" / "demo_model" / "ntp")
            args.model_label = ("the shipped demo model (sbd/demo_model/ntp, 4.7M parameters)" if args.model is None
                                else args.model)
        results = []
        for recipe in recipes:
            r = run_recipe(recipe, args, model_path, data, work)
            results.append(r)
            print(f"{recipe}: sbd train {r['sbd']['tokens_per_s']:.0f} tokens/s, plain loop "
                  f"{r['plain']['tokens_per_s']:.0f} tokens/s, ratio {r['ratio']:.2f}x", file=sys.stderr, flush=True)
    text = report(results, info, args, command)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_throughput.md").write_text(text)
        (out / "train_throughput.json").write_text(json.dumps(
            {"command": command, "machine": info, "settings": {k: v for k, v in vars(args).items()},
             "results": results}, indent=1))


if __name__ == "__main__":
    main()
