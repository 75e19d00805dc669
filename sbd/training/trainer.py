"""SBDTrainer: the SBD recipe as a `transformers.Trainer` subclass.

Trainer already gives what a user of Hugging Face expects: DDP/FSDP through accelerate (`torchrun`,
`accelerate launch`), gradient accumulation, AdamW with warmup + cosine, resume with optimiser,
scheduler, RNG and data position. This subclass adds the SBD parts:

- the randomness of SBD (block size k per optimisation step, η and the mask draws per sequence) is a
  pure function of (seed, optimisation step, dataset index). It is drawn in `get_batch_samples`, the
  one place that sees all micro-batches of a step together, after the data loader has produced them.
  So it does not depend on data-loader prefetching, on how batches are split over processes, or on
  whether the run was resumed;
- the pooled loss (one mean over every valid target of the whole step, across micro-batches and
  processes), with NTP and MATP losses and tokens/s logged separately;
- atomic checkpoints, Ctrl-C or SIGTERM = save and stop, a clear stop on a NaN/inf loss or gradient
  norm (checked where the Trainer reads its numbers anyway: no host read is added per step);
- flex_attention's BlockMask for the training mask on CUDA, a dense bool mask elsewhere; on CUDA every
  batch is padded to a length of `flex.bucket_length`, so that compiled flex_attention kernels are
  reused rather than recompiled at every step (same loss: padding carries no label and is masked out);
- a cheaper forward with the same loss and gradients (`sbd/training/attention.py`);
- no host read of a device value per step on CUDA (`sync_free`): the batch is built on the host, where
  its labelled positions and targets are found too, and copied without waiting; the loss and the gradient
  norm are checked for NaN/inf in one read before every log line and checkpoint (the Trainer's own
  per-step read of the loss, `logging_nan_inf_filter`, is off: SBDTrainer stops on a non-finite loss).

The sampler head's loss is in `head_loss.py`, the callbacks (stop, convergence log, progress bar, metrics
file) in `callbacks.py`.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
import time


import torch
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..drafters import adapter as adapters
from ..drafters import sampler_head as heads
from ..drafters.adapter import adapter_of
from ..errors import SBDError
from ..models.quantized import QuantizedLinear
from . import checkpoints as ckpt
from .attention import training_logits
from .collator import SBDDataCollator
from .adapter_forward import adapter_logits, kl_sum, latent_sum
from .attention import labelled_rows
from .callbacks import _ConvergenceLog, _MetricsLog, _ProgressBar, _StopCallback
from .collator import IGNORE
from .flex import bucket_length
from .head_loss import HEAD_MODES, check_head_options, head_terms
from .loss import loss_targets, position_weights, sbd_loss
from .options import PYTHON, check_adapter_options

MODES = ("sbd", "ntp", "adapter")
_MASK64 = (1 << 64) - 1
_BLOCK_TAG = 0x4B4B


def mix(*values: int) -> int:
    """A 63-bit seed from a tuple of integers (splitmix64-style mixing; stable across runs and hosts)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = ((h ^ (int(v) & _MASK64)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


SCHEDULES = ("cosine", "cooldown")


def sbd_training_args(output_dir, *, steps: int, batch_size: int = 8, lr: float = 3e-4, warmup_steps: int = 200,
                      grad_accum: int = 1, seed: int = 0, save_steps: int = 500, logging_steps: int = 10,
                      save_total_limit: int | None = 2, weight_decay: float = 0.0, max_grad_norm: float = 1.0,
                      schedule: str = "cosine", **overrides) -> TrainingArguments:
    """TrainingArguments with the paper's optimiser (AdamW, warmup then cosine) and what SBDTrainer needs.

    schedule "cooldown": after the warmup the rate falls as 1 − sqrt(progress) to 0 (the cool-down of
    warmup-stable-decay schedules, arXiv 2405.18392), for a short run that continues a trained adapter."""
    if schedule not in SCHEDULES:
        raise SBDError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    cuda = torch.cuda.is_available()
    kw = dict(
        output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=grad_accum, learning_rate=lr, warmup_steps=warmup_steps,
        lr_scheduler_type="cosine" if schedule == "cosine" else "warmup_stable_decay", optim="adamw_torch", weight_decay=weight_decay, max_grad_norm=max_grad_norm,
        seed=seed, data_seed=seed, save_strategy="steps", save_steps=save_steps, save_total_limit=save_total_limit,
        logging_strategy="steps", logging_steps=logging_steps, report_to="none", remove_unused_columns=False,
        use_cpu=not cuda, bf16=cuda and torch.cuda.is_bf16_supported(), dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
        # the Trainer would read every step's loss on the host to drop NaN/inf from its running mean;
        # SBDTrainer stops on a non-finite loss instead, checked without a read per step (_check_finite)
        logging_nan_inf_filter=False,
    )
    if schedule == "cooldown":
        kw["lr_scheduler_kwargs"] = {"num_decay_steps": max(0, steps - warmup_steps),  # no stable phase
                                     "decay_type": "1-sqrt", "min_lr_ratio": 0.0}
    kw.update(overrides)
    return TrainingArguments(**kw)


class _Indexed(torch.utils.data.Dataset):
    """Adds each item's dataset index (the key of its masking randomness) when it lacks one."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        item = self.dataset[i]
        return item if "index" in item else {**item, "index": i}


class SBDTrainer(Trainer):
    """A Trainer for SBD fine-tuning (`mode="sbd"`), the matching NTP baseline (`mode="ntp"`), or a
    drafting adapter over the frozen model (`mode="adapter"`: the model carries an `sbd.drafters.adapter`, only
    its parameters train, masked loss only (+ `kl_weight` × the KL from the frozen next-token head,
    + `latent_weight` × the latent-consistency term, `adapter_forward.latent_sum`);
    checkpoints and the final folder hold the adapter alone, in peft's file layout).

    data_collator: an `SBDDataCollator` (built from `processing_class` and the model's mask token if
    omitted). The model is called without labels; the loss is `sbd.training.loss.sbd_loss`.
    metrics_file: a jsonl file that receives every log line (main process only).
    convergence_examples: held-out `{"input_ids", "prompt_length"}` examples; every `convergence_steps`
    steps (default: the save interval) and at the end, the teacher-forced masked vs NTP accuracy on them
    (`sbd.training.convergence`) is logged as masked_acc, ntp_acc and gap, so a user sees when SBD
    fine-tuning has converged.

    sampler_head (mode "adapter", with a head attached: `sbd.drafters.sampler_head.attach`): "joint" adds the
    head's teacher-forced loss (`sampler_head_weight` ×, logged as head_loss) to the masked loss;
    "only" trains the head alone over the frozen adapter: the model forward runs without autograd, so
    a step costs about one forward. Each masked target at block offset ≥ 1 is a head target, fed the
    true token before it. head_base_loss logs the masks' own loss on the same targets.
    """

    def __init__(self, model=None, args: TrainingArguments | None = None, data_collator=None, train_dataset=None,
                 processing_class=None, *, mode: str = "sbd", metrics_file=None, show_progress: bool = True,
                 convergence_examples=None, convergence_steps: int | None = None, convergence_block_size: int = 16,
                 kl_weight: float = 0.0, grad_layer: int = 0, position_decay: float | None = None,
                 sampler_head: str | None = None, sampler_head_weight: float = 1.0, bf16: bool = False,
                 latent_weight: float = 0.0, **kwargs):
        if mode not in MODES:
            raise SBDError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode == "adapter" and adapter_of(model) is None:
            raise SBDError("mode='adapter' trains a drafting adapter: attach one first (sbd.drafters.adapter.attach)")
        check_adapter_options(PYTHON, adapter=mode == "adapter", head_only=sampler_head == "only",
                              kl_weight=kl_weight, latent_weight=latent_weight, grad_layer=grad_layer,
                              position_decay=position_decay)
        if model is None or train_dataset is None:
            raise SBDError("SBDTrainer needs a model and a train_dataset")
        if any(isinstance(m, QuantizedLinear) for m in model.modules()):  # their products pass no gradients back
            raise SBDError("the model's linear layers are int4/int8 (sbd.load holds a GGUF's own numbers so on a "
                           "CPU), and gradients do not pass through them; load it with weights=\"float\" to train")
        check_head_options(model, mode, sampler_head, sampler_head_weight)
        autocast_device = _bf16_device(model) if bf16 else None
        model_mask = getattr(model.config, "sbd_mask_token_id", None)
        if data_collator is None:
            data_collator = SBDDataCollator(processing_class, mask_token_id=model_mask)
        if not isinstance(data_collator, SBDDataCollator):
            raise SBDError("SBDTrainer needs an SBDDataCollator as data_collator")
        vocab = model.get_input_embeddings().num_embeddings
        if mode != "ntp" and not 0 <= data_collator.mask_token_id < vocab:
            raise SBDError(f"mask token id {data_collator.mask_token_id} lies outside the model's {vocab} embeddings; "
                           "call sbd.add_mask_token(model, tokenizer) first")
        if args is None:
            args = sbd_training_args("sbd_output", steps=1000)
        args.remove_unused_columns = False  # our collator needs prompt_length and index
        if hasattr(train_dataset, "__getitem__") and hasattr(train_dataset, "__len__"):
            train_dataset = _Indexed(train_dataset)
        super().__init__(model=model, args=args, data_collator=data_collator.pad, train_dataset=train_dataset,
                         processing_class=processing_class, **kwargs)
        self.sbd_collator = data_collator
        self.mode = mode
        self.kl_weight = float(kl_weight)
        self.latent_weight = float(latent_weight)
        self.grad_layer = int(grad_layer)  # decoder layers below it run without autograd (adapter_forward.py)
        self.position_decay = position_decay
        self.head_mode = sampler_head
        self.head_weight = float(sampler_head_weight)
        self.autocast_device = autocast_device  # "cpu"/"cuda": forward and loss under bf16 autocast; None: off
        self.noise_seed = data_collator.seed if data_collator.seed is not None else args.seed
        self.loss_is_scaled_for_ga = True  # compute_loss divides by the whole step's target count
        # logits only at labelled positions (both modes) and, on CPU with SDPA, causal attention for the
        # clean half (sbd/training/attention.py); False: the plain forward (same loss and gradients)
        self.fast_forward = True
        # leave out the noisy blocks that hold no label (mode "sbd"; `SBDDataCollator.corrupt`): nothing else
        # attends to them, so the loss and gradients are the same; False: every block, as the paper lays them out
        self.drop_unlabelled = True
        # no host read of a device value per step: labelled positions found on the host, batches copied
        # without waiting (sbd/training/attention.py `labelled_rows`); None: on CUDA only (on a CPU a read
        # costs nothing and the boolean logits_to_keep computes the head on fewer rows)
        self.sync_free = None
        self.interrupted = False
        self.stop_signal = None  # signal.SIGINT or SIGTERM when one of them stopped the run
        self._stop_requested = False
        self._pending = []  # (step, "loss" | "gradient norm", value) not yet checked for NaN/inf (`_check_finite`)
        self._staging = None
        self._micro = 0
        self._stats = None
        self._last_log = time.perf_counter()
        self.remove_callback(ProgressCallback)
        self.remove_callback(PrinterCallback)
        self.add_callback(_StopCallback(self))
        if show_progress:
            self.add_callback(_ProgressBar(mode))
        if metrics_file is not None:
            self.add_callback(_MetricsLog(metrics_file))
        if convergence_examples:
            every = convergence_steps or args.save_steps
            if not isinstance(every, int) or every < 1:
                raise SBDError(f"convergence_steps must be an integer >= 1, got {every!r}")
            self.add_callback(_ConvergenceLog(self, list(convergence_examples), every, convergence_block_size))

    # -- randomness and batches ------------------------------------------------------------------
    def block_size_for_step(self, step: int) -> int:
        """k of optimisation step `step` (0-based): fixed, or uniform on the collator's range."""
        c = self.sbd_collator
        if c.block_size is not None:
            return c.block_size
        return random.Random(mix(self.noise_seed, step, _BLOCK_TAG)).randint(*c.block_size_range)

    def _use_flex(self) -> bool:
        return (self.mode != "adapter" and self.args.device.type == "cuda"
                and getattr(self.model.config, "_attn_implementation", "") == "flex_attention")

    def _sync_free(self) -> bool:
        return self.args.device.type == "cuda" if self.sync_free is None else bool(self.sync_free)

    def build_batch(self, clean: dict, step: int, micro: int = 0) -> dict:
        """The model batch of one padded micro-batch at optimisation step `step`."""
        c = self.sbd_collator
        if self.mode == "ntp":
            flex = self._use_flex()
            n = clean["input_ids"].shape[1]
            batch = c.causal(clean, width=bucket_length(n) if flex else None)
            if flex:  # the causal mask as our BlockMask (transformers would build one reading the padding mask)
                from .flex import training_block_mask

                zeros = torch.zeros_like(clean["lengths"])
                batch["attention_mask"] = training_block_mask(clean["lengths"], zeros, zeros,
                                                              batch["input_ids"].shape[1], 0, 1, self.args.device)
        else:
            k = self.block_size_for_step(step)
            m = c.noisy_length(clean, k)
            rank = self.args.process_index
            keys = [mix(self.noise_seed, step, i) if i >= 0 else mix(self.noise_seed, step, rank, micro, row, 1)
                    for row, i in enumerate(clean["index"].tolist())]
            gens = [torch.Generator().manual_seed(s) for s in keys]
            eta, u = c.draw_noise(len(keys), m, gens)
            windows = c.draw_windows(len(keys), c.block_count(clean, k), gens)
            flex = self._use_flex()
            batch = c.corrupt(clean, k, eta, u, dense_mask=not flex, block_noise=c.draw_block_noise(len(keys), m, gens),
                              windows=windows, drop_unlabelled=self.mode == "sbd" and self.drop_unlabelled,
                              length_to=bucket_length if flex else None)
            if flex:
                from .flex import training_block_mask

                n = batch["num_clean"]
                batch["attention_mask"] = training_block_mask(
                    clean["lengths"], c._origins(clean), c.noisy_lengths(clean, k), n, batch["input_ids"].shape[1] - n,
                    k, self.args.device, layout=batch.pop("noisy_layout"))
            if self.mode == "adapter":  # the NTP head is frozen: no NTP targets; where each noisy token comes from
                n = clean["input_ids"].shape[1]
                batch["labels"][:, :n] = IGNORE
                batch["source_positions"] = c.sources(clean, k, windows)
                if self.head_mode is not None:  # teacher forcing: the true token before each target
                    batch["previous_tokens"] = c.previous_tokens(clean, k, windows)
                if self.position_decay is not None:
                    batch["loss_weights"] = self._weights(batch["labels"], n, k)
        batch["num_tokens"] = clean["lengths"].sum()
        if self.mode != "adapter":  # what the loss needs to know about the labels, found here on the host
            batch["targets"], batch["target_clean"] = loss_targets(batch["labels"], batch["num_clean"])
            if self._sync_free():
                batch["label_positions"], batch["label_select"] = labelled_rows(batch["labels"])
        return batch

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The micro-batches of one optimisation step, built with that step's k, and their target count.
        On CUDA they are copied to the device here, without waiting (the Trainer's own copy would wait for
        the device to finish the previous step)."""
        cleans = []
        for _ in range(num_batches):
            try:
                cleans.append(next(epoch_iterator))
            except StopIteration:
                break
        step = self.state.global_step
        batches = [self.build_batch(c, step, i) for i, c in enumerate(cleans)]
        count = self._get_num_items_in_batch(batches, device)
        if self._sync_free() and torch.device(device).type == "cuda":
            batches = [{key: _to_device(v, device) for key, v in b.items()} for b in batches]
        return batches, count

    def _weights(self, labels: torch.Tensor, num_clean: int, block_size: int) -> torch.Tensor:
        """(N,) loss weights of the labelled noisy positions, row-major (`loss.position_weights`)."""
        offsets = (labels[:, num_clean:] != IGNORE).nonzero()[:, 1] % block_size
        return position_weights(offsets, self.position_decay)

    def _get_num_items_in_batch(self, batch_samples, device):
        if not batch_samples:
            return None
        if self.position_decay is not None:  # the weighted mean is over the step's total weight
            count = _to_device(sum(b["loss_weights"].sum() for b in batch_samples), device)
        else:
            count = _to_device(sum((b["labels"] != -100).sum() for b in batch_samples), device)
        if self.args.world_size > 1:
            count = self.accelerator.gather(count).sum()
        return count

    # -- loss ------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.autocast_device is None:
            return self._compute_loss(model, inputs, return_outputs, num_items_in_batch)
        with torch.autocast(self.autocast_device, dtype=torch.bfloat16):
            return self._compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        num_clean = inputs.pop("num_clean")
        num_tokens = inputs.pop("num_tokens")
        source = inputs.pop("source_positions", None)
        weights = inputs.pop("loss_weights", None)
        previous = inputs.pop("previous_tokens", None)
        targets, target_clean = inputs.pop("targets", None), inputs.pop("target_clean", None)
        positions, select = inputs.pop("label_positions", None), inputs.pop("label_select", None)
        kl = head = latent = None
        if self.mode == "adapter":  # two passes, the clean one without autograd (training/adapter_forward.py)
            frozen = torch.no_grad() if self.head_mode == "only" else contextlib.nullcontext()
            with frozen:  # head alone: no autograd through the model at all
                out = adapter_logits(model, inputs, labels, num_clean,
                                     source if self.kl_weight or self.latent_weight else None,
                                     grad_layer=self.grad_layer,
                                     with_hidden=self.head_mode is not None or bool(self.latent_weight),
                                     base_hidden=bool(self.latent_weight), base_logits=bool(self.kl_weight))
            outputs, logits = None, out.logits
            if self.kl_weight:
                kl = kl_sum(out.logits, out.base_logits, out.kl_valid)
            if self.latent_weight:
                latent = latent_sum(out.hidden, out.base_hidden, out.kl_valid)
            if self.head_mode is not None:
                head = head_terms(model, out, labels, num_clean, previous, weights)
        elif return_outputs or not self.fast_forward:
            outputs = model(**inputs, use_cache=False)
            logits = outputs.logits
        else:  # same loss and gradients, cheaper: see sbd/training/attention.py
            outputs = None
            logits = training_logits(model, inputs, labels, num_clean if self.mode == "sbd" else None,
                                     rows=(positions, select) if positions is not None else None,
                                     num_labelled=targets.shape[0] if targets is not None else None)
        parts = sbd_loss(logits, labels, num_clean, num_items_in_batch, weights, targets=targets,
                         target_clean=target_clean)
        loss = parts.loss
        denominator = num_items_in_batch if num_items_in_batch is not None else (
            weights.sum() if weights is not None else (labels != IGNORE).sum())
        denominator = torch.as_tensor(denominator, device=logits.device).clamp_min(1)
        if kl is not None:
            loss = loss + self.kl_weight * kl / denominator
        if latent is not None:
            loss = loss + self.latent_weight * latent / denominator
        if self.head_mode == "only":  # the masked loss has no gradient here: the head's loss alone
            loss = head.loss / denominator
        elif head is not None:
            loss = loss + self.head_weight * head.loss / denominator
        self._keep_for_check("loss", loss.detach())  # NaN/inf: read with the others, not now (_check_finite)
        if num_items_in_batch is not None and self.args.world_size > 1:
            loss = loss * self.args.world_size  # DDP averages gradients; the mean is over the global count
        zero = parts.ntp_sum * 0
        stats = torch.stack([parts.ntp_sum, parts.ntp_count.to(parts.ntp_sum), parts.matp_sum,
                             parts.matp_count.to(parts.ntp_sum), num_tokens.to(parts.ntp_sum),
                             (kl.detach() if kl is not None else zero),
                             *((head.ce_sum, head.base_sum, head.count.to(zero)) if head is not None else (zero,) * 3),
                             (latent.detach() if latent is not None else zero)])
        self._stats = stats if self._stats is None else self._stats + stats
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict, start_time=None) -> None:
        self._check_finite()  # before a non-finite number reaches the log (or a checkpoint after it)
        if "loss" in logs and self._stats is not None:
            stats = self._stats
            if self.args.world_size > 1:
                stats = self.accelerator.reduce(stats, reduction="sum")
            ntp_sum, ntp_n, matp_sum, matp_n, tokens, kl, head_sum, head_base, head_n, latent = stats.tolist()
            self._stats = None
            now = time.perf_counter()
            if self.mode != "adapter":
                logs["ntp_loss"] = ntp_sum / max(ntp_n, 1)
            if self.mode in ("sbd", "adapter"):
                logs["matp_loss"] = matp_sum / max(matp_n, 1)
            if self.kl_weight:
                logs["kl"] = kl / max(matp_n, 1)
            if self.latent_weight:
                logs["latent"] = latent / max(matp_n, 1)
            if self.head_mode is not None:  # the head's loss and the masks' own on the same targets
                logs["head_loss"] = head_sum / max(head_n, 1)
                logs["head_base_loss"] = head_base / max(head_n, 1)
            logs["tokens_per_s"] = tokens / max(now - self._last_log, 1e-9)
            self._last_log = now
        super().log(logs, start_time)

    # -- non-finite numbers -----------------------------------------------------------------------
    def _get_grad_norm(self, model, grad_norm=None):
        """Trainer's gradient norm of the step (before clipping), kept for `_check_finite` as it is: reading
        it now would add a host read to every step."""
        norm = super()._get_grad_norm(model, grad_norm)
        if norm is not None:
            self._keep_for_check("gradient norm", norm.detach() if torch.is_tensor(norm) else norm)
        return norm

    def _keep_for_check(self, what: str, value) -> None:
        """A loss (every micro-batch) or gradient norm (every step) of the current step, for `_check_finite`."""
        self._pending.append((self.state.global_step + 1, what, value))
        if len(self._pending) >= 1024:  # rare logs and checkpoints: still one read per 1024 values, no more
            self._check_finite()

    def _check_finite(self) -> None:
        """SBDError naming the first step since the last check whose loss or gradient norm was NaN or inf
        (a step's loss before its gradient norm). Called before every log line and every checkpoint (one
        host read for all the steps between them) and at the end, so that a non-finite state is never saved
        and never reported as trained."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        device = next((v.device for _, _, v in pending if torch.is_tensor(v)), None)
        values = torch.stack([torch.as_tensor(v, device=device).float().reshape(()) for _, _, v in pending]).tolist()
        for (step, what, _), value in zip(pending, values):
            if not math.isfinite(value):
                raise self._nonfinite(what, value, step)

    def _nonfinite(self, what: str, value: float, step: int) -> SBDError:
        last = ckpt.latest_checkpoint(self.args.output_dir)
        hints = [f"a lower learning rate (--lr, now {self.args.learning_rate:g})"]
        for name, weight in (("latent-weight", self.latent_weight), ("kl-weight", self.kl_weight)):
            if weight:
                hints.append(f"a lower --{name} (now {weight:g})")
        return SBDError(f"the {what} became {value} at step {step}; stopped, nothing saved after it. Last good "
                        f"checkpoint: {last or 'none'} (try {', or '.join(hints)})")

    # -- stopping and checkpoints ----------------------------------------------------------------
    def request_stop(self) -> None:
        """Save a checkpoint after the current optimisation step and stop (what Ctrl-C does)."""
        self._stop_requested = True

    def train(self, *args, **kwargs):
        """Trainer's train, with Ctrl-C (SIGINT) and SIGTERM turned into: save a checkpoint after the current
        optimisation step, then stop (`interrupted`, `stop_signal`). A Ctrl-C after that stops at once; a repeated
        SIGTERM is ignored (a launcher such as torchrun forwards the SIGTERM its process group got too) and
        must not cut the checkpoint short. Ends with `_check_finite`."""
        self.interrupted = False
        self.stop_signal = None
        self._stop_requested = False
        self._pending = []
        self._last_log = time.perf_counter()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            def on_sigint(signum, frame):
                if self._stop_requested:  # a Ctrl-C after a stop request stops at once
                    raise KeyboardInterrupt
                self._stop_requested = True
                self.stop_signal = self.stop_signal or signal.SIGINT

            def on_sigterm(signum, frame):
                self._stop_requested = True
                self.stop_signal = self.stop_signal or signal.SIGTERM

            for sig, handler in ((signal.SIGINT, on_sigint), (signal.SIGTERM, on_sigterm)):
                previous[sig] = signal.signal(sig, handler)
        try:
            result = super().train(*args, **kwargs)
            self._check_finite()
            return result
        finally:
            for sig, handler in previous.items():
                if handler is not None:  # None: a handler not installed from Python, which cannot be put back
                    signal.signal(sig, handler)

    def _save(self, output_dir=None, state_dict=None):
        """Adapter mode: the adapter alone (peft's two files) and the tokenizer; else Trainer's save."""
        if self.mode != "adapter":
            return super()._save(output_dir, state_dict)
        if not self.args.should_save:
            return None
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        model = self.accelerator.unwrap_model(self.model)
        adapters.save(model, output_dir)
        if heads.head_of(model) is not None:
            heads.save(model, output_dir)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        return None

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """Adapter mode: the saved adapter into the attached one; else Trainer's load."""
        if self.mode != "adapter":
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        model = self.accelerator.unwrap_model(model if model is not None else self.model)
        adapters.load_weights(model, resume_from_checkpoint)
        if heads.head_of(model) is not None:
            heads.load_weights(model, resume_from_checkpoint)
        return None

    def _get_output_dir(self, trial):
        return str(self._staging) if self._staging is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint, written into a staging folder and renamed into place when complete."""
        self._check_finite()  # never a checkpoint of a state reached through a NaN/inf gradient
        run_dir = self.args.output_dir
        name = f"checkpoint-{self.state.global_step}"
        if self.args.should_save:
            ckpt.reset_staging(run_dir)
        self.accelerator.wait_for_everyone()
        self._staging = ckpt.staging_dir(run_dir)
        try:
            super()._save_checkpoint(model, trial)
        except (OSError, RuntimeError) as e:  # a full disk: torch.save says so as a RuntimeError
            if isinstance(e, RuntimeError) and "writ" not in str(e).lower():
                raise
            reason = getattr(e, "strerror", None) or str(e).strip().splitlines()[0]
            raise SBDError(f"cannot write {name} into {run_dir}: {reason}; the checkpoints already there are "
                           "intact (free space, then --resume)") from None
        finally:
            self._staging = None
        self.accelerator.wait_for_everyone()  # every rank has written its files (RNG state is per rank)
        if self.args.should_save:
            ckpt.publish(run_dir, name)
            ckpt.rotate(run_dir, self.args.save_total_limit)
        self.accelerator.wait_for_everyone()


def _to_device(value, device):
    """A host tensor on `device`; to CUDA from pinned memory without waiting for the device (a plain copy
    from pageable memory synchronises the stream first)."""
    if not torch.is_tensor(value) or value.device == torch.device(device):
        return value
    if value.device.type == "cpu" and torch.device(device).type == "cuda":
        return value.pin_memory().to(device, non_blocking=True)
    return value.to(device)


def cpu_computes_bf16() -> bool:
    """Whether this CPU has oneDNN's bfloat16 path (AVX-512 or AMX), so that bf16 autocast pays."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _bf16_device(model) -> str:
    """Where bf16 autocast runs for `model`; SBDError where it would not pay (emulated bfloat16)."""
    device = next(model.parameters()).device.type
    if device == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise SBDError("bf16: this GPU has no bfloat16 support; leave bf16 off")
        return device
    if device != "cpu":
        raise SBDError(f"bf16 autocast is supported on cpu and cuda, not {device}")
    if not cpu_computes_bf16():
        raise SBDError("bf16: this CPU has no bfloat16 path (oneDNN needs AVX-512 or AMX); emulated it runs many "
                       "times slower than float32: leave bf16 off")
    return device
