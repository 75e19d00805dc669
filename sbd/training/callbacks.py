"""What `SBDTrainer` hangs on transformers' Trainer: a stop request turned into save and stop, the held-out
convergence check in the logs, a progress bar, and the metrics file (one JSON line per log entry, trimmed on
resume)."""

from __future__ import annotations

import json
import os
import sys

import torch
from transformers import TrainerCallback


class _StopCallback(TrainerCallback):
    """Turns a stop request (Ctrl-C on any process) into save + stop after the current step."""

    def __init__(self, trainer: "SBDTrainer"):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        flag = self.trainer._stop_requested
        if args.world_size > 1:
            t = torch.tensor([float(flag)], device=args.device)
            flag = bool(self.trainer.accelerator.reduce(t, reduction="sum").item() > 0)
        if flag:
            self.trainer.interrupted = True
            control.should_save = control.should_training_stop = control.should_log = True
        return control


class _ConvergenceLog(TrainerCallback):
    """Every `every` steps and at the end: the held-out masked vs NTP accuracy, logged like the losses."""

    def __init__(self, trainer: "SBDTrainer", examples: list, every: int, block_size: int):
        self.trainer, self.examples, self.every, self.block_size = trainer, examples, every, block_size

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step % self.every and step < state.max_steps and not control.should_training_stop:
            return control
        from .convergence import convergence_check

        h = convergence_check(self.trainer.model, self.examples, block_size=self.block_size).headline()
        self.trainer.log({"masked_acc": round(h["masked_acc"], 2), "ntp_acc": round(h["ntp_acc"], 2),
                          "full_mask_acc": round(h["full_mask_acc"], 2), "gap": round(h["gap"], 2)})
        return control


class _ProgressBar(TrainerCallback):
    """tqdm bar with loss, NTP loss, MATP loss and tokens/s (main process only)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc=f"sbd train ({self.mode})",
                            dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs and "gap" in logs:
            self.bar.write(f"step {state.global_step}: held-out masked accuracy {logs['masked_acc']:.1f}% vs NTP "
                           f"{logs['ntp_acc']:.1f}% (gap {logs['gap']:+.1f} points)")
        if self.bar is not None and logs and "loss" in logs:
            post = {"loss": f"{logs['loss']:.3f}"}
            for key, name in (("ntp_loss", "ntp"), ("matp_loss", "matp"), ("kl", "kl"), ("head_loss", "head")):
                if key in logs:  # what this run trains (an adapter has no next-token loss)
                    post[name] = f"{logs[key]:.3f}"
            post["tok/s"] = f"{logs.get('tokens_per_s', 0):.0f}"
            self.bar.set_postfix(post, refresh=False)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class _MetricsLog(TrainerCallback):
    """Appends every log entry as one json line; on resume, drops lines past the resumed step and the
    interrupted run's closing summary."""

    def __init__(self, path):
        self.path = str(path)

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or not os.path.exists(self.path):
            return
        lines, torn = [], 0
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for ln in f:
                try:
                    entry = json.loads(ln) if ln.strip() else None
                except ValueError:
                    torn += 1  # an interrupted write
                    continue
                # a resumed run keeps what was logged up to its step, but not the interrupted run's closing
                # summary (train_runtime …): it sits at a step the resumed run logs again, listing it twice
                if isinstance(entry, dict) and entry.get("step", 0) <= state.global_step and "train_runtime" not in entry:
                    lines.append(ln if ln.endswith("\n") else ln + "\n")
        if torn:
            print(f"sbd: dropped {torn} unreadable line(s) of {self.path} (an interrupted write)", file=sys.stderr)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.replace(tmp, self.path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": state.global_step, **logs}) + "\n")
