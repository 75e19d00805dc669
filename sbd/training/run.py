"""One training run: `train(TrainConfig(...))` — what `sbd train` and `sbd experiment` both call.

Loads the start model, gives it a mask token, tokenizes the data, builds the collator and the
`SBDTrainer`, holds the output folder's lock, resumes when asked, and saves the final model. Runs
unchanged under `torchrun` / `accelerate launch` (every process calls `train`; only rank 0 writes).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from ..errors import SBDError
from .options import CLI, check_adapter_options

RUN_FILE = "sbd_train.json"
METRICS_FILE = "metrics.jsonl"
RG_PREFIX = "reasoning-gym:"
DEFAULT_MAX_LEN = 1024


def _opt(help_text: str, **extra) -> dict:
    return {"help": help_text, **extra}


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run. Field names are the `sbd train` options (`_` → `-`).

    Frozen: its values are checked once, when it is made, and the run only reads them. What the run fills
    in itself (--max-len from the model's context) makes a new config (`dataclasses.replace`, checked
    again), which is the one the run uses and records in `RUN_FILE`.

    `resume_keys` lists what a resumed run must share with the run it continues.
    """

    model: str = field(metadata=_opt(
        "local model folder (safetensors) to start from; with --adapter lora also a drafting adapter's folder (or "
        "a packaged model such as smollm2), whose adapter training then continues", required=True))
    data: str = field(metadata=_opt("FILE.jsonl with {prompt, completion} or {text} records, or "
                                    "reasoning-gym:NAME?size=N&seed=S", required=True))
    out: str = field(metadata=_opt("output folder: checkpoints, metrics.jsonl and the final model", required=True))
    mode: str = field(default="sbd", metadata=_opt("sbd: the SBD recipe; ntp: plain next-token loss on the same "
                                                   "data", choices=("sbd", "ntp")))
    adapter: Optional[str] = field(default=None, metadata=_opt(
        "lora: train a drafting adapter over the frozen model instead of all its weights (low-rank updates active "
        "on block positions only, so the model's own predictions and answers stay exactly its own; masked loss "
        "only); --out then holds the adapter (adapter_config.json + adapter_model.safetensors)",
        choices=("lora",)))
    rank: int = field(default=16, metadata=_opt("--adapter: rank of the low-rank updates"))
    alpha: float = field(default=32.0, metadata=_opt("--adapter: scale of the updates (alpha / rank)"))
    kl_weight: float = field(default=0.0, metadata=_opt(
        "--adapter: weight of the distillation term, KL from the frozen model's next-token distribution to the "
        "masked prediction of each target (0: off)"))
    latent_weight: float = field(default=0.0, metadata=_opt(
        "--adapter: weight of the latent-consistency term (Apple's LCM): the mean squared distance between each "
        "mask's last hidden state and the frozen model's at the position that predicts the same token (0: off)"))
    steps: int = field(default=1000, metadata=_opt("optimisation steps"))
    batch_size: int = field(default=8, metadata=_opt("sequences per device per micro-batch"))
    grad_accum: int = field(default=1, metadata=_opt("micro-batches per optimisation step"))
    lr: float = field(default=3e-4, metadata=_opt("peak learning rate of AdamW"))
    warmup_steps: Optional[int] = field(default=None, metadata=_opt(
        "linear warmup before the decay (default: 200, or steps/10 if that is smaller)"))
    schedule: str = field(default="cosine", metadata=_opt(
        "learning-rate decay after the warmup: cosine (the paper's) or cooldown, 1 - sqrt down to 0 (a short "
        "cool-down run from a trained adapter, e.g. --model smollm2 with a low --lr)",
        choices=("cosine", "cooldown")))
    max_len: Optional[int] = field(default=None, metadata=_opt(
        "longer sequences are truncated (default: 1024, or the model's context if that is shorter)"))
    block_size_min: int = field(default=2, metadata=_opt("smallest block size drawn"))
    block_size_max: int = field(default=16, metadata=_opt("largest block size drawn"))
    block_size: Optional[int] = field(default=None, metadata=_opt("use this block size at every step instead"))
    mask_rate: Optional[float] = field(default=None, metadata=_opt("fixed masking rate instead of eta ~ U(0,1)"))
    align_to_completion: bool = field(default=False, metadata=_opt(
        "noisy copy holds only the completion, blocks start at its first token (prompt/completion data)"))
    last_block: str = field(default="eos", metadata=_opt(
        "eos: pad the block that holds a sequence's final EOS with EOS targets, so the block decoding stops in "
        "is trained for every block size; drop: the paper's rule, masked targets only inside complete blocks",
        choices=("eos", "drop")))
    suffix_share: float = field(default=0.0, metadata=_opt(
        "share of blocks masked as a suffix (first tokens visible, the rest masked) instead of independently at "
        "rate eta"))
    noisy_blocks: Optional[int] = field(default=None, metadata=_opt(
        "train only this many randomly drawn blocks of each sequence per step instead of all of them (the step "
        "costs in proportion to the blocks trained; the clean half stops after the last one). Default: all"))
    train_layers_from: int = field(default=0, metadata=_opt(
        "--adapter: train the updates of decoder layers >= N only; those below and the mask embedding keep their "
        "values (e.g. from a warm start), and the masked half runs them without autograd (cheaper steps). 0: all"))
    position_decay: Optional[float] = field(default=None, metadata=_opt(
        "--adapter: weight a masked target at block offset i by DECAY^(i-1) (offsets 0 and 1 weigh 1): the first "
        "draft positions decide how many tokens sbd-verify accepts. Default: equal weights"))
    sampler_head: bool = field(default=False, metadata=_opt(
        "--adapter: also train a sampler head with the adapter: a small MLP that redrafts each block position "
        "from its masked hidden state and the token before it, so that sbd-verify's drafts see each other (never "
        "changes the output). Saved beside the adapter (sampler_head.safetensors); an adapter --model's head "
        "is continued"))
    sampler_head_only: bool = field(default=False, metadata=_opt(
        "--adapter: train only a sampler head over the frozen trained adapter given as --model (the model runs "
        "without autograd: a step costs about one forward); the adapter is saved unchanged beside it"))
    sampler_head_width: Optional[int] = field(default=None, metadata=_opt(
        "inner width of a new sampler head (default: 256, or the width of the head being continued)"))
    sampler_head_state: bool = field(default=False, metadata=_opt(
        "with --sampler-head or --sampler-head-only: the head also carries its own inner state from one draft "
        "position to the next, so each draft reads the whole chain drafted before it, not only the last token. "
        "A stateless head being continued gains the state at zero (it starts by drafting exactly as before)"))
    sampler_head_weight: float = field(default=1.0, metadata=_opt(
        "--sampler-head: weight of the head's loss next to the masked loss"))
    group_by_length: bool = field(default=False, metadata=_opt(
        "batch sequences of similar length together (less padding computed per step)"))
    bf16: bool = field(default=False, metadata=_opt(
        "run forwards and backwards under bfloat16 autocast (weights and optimizer state stay float32). "
        "On a CPU only where oneDNN computes bfloat16 (AVX-512 or AMX): 1.5-1.75x cheaper per sequence for "
        "the SmolLM2 adapter on a 2-core Zen 4 (AVX-512 BF16); refused elsewhere (AVX2: emulated, many times "
        "slower). On a GPU that supports it, bf16 is always on"))
    seed: int = field(default=0, metadata=_opt(
        "seed of everything random in the run: a new adapter's and sampler head's initialisation, data order, "
        "masks, block sizes (the same seed and settings repeat a run exactly on the same machine)"))
    save_steps: int = field(default=500, metadata=_opt("checkpoint every N steps, and at the end"))
    save_total_limit: int = field(default=2, metadata=_opt("checkpoints kept (0 keeps all)"))
    logging_steps: int = field(default=10, metadata=_opt("log every N steps"))
    attention: str = field(default="auto", metadata=_opt(
        "auto: flex_attention on CUDA, SDPA with a dense mask elsewhere", choices=("auto", "sdpa", "flex")))
    eval_data: Optional[str] = field(default=None, metadata=_opt(
        "held-out data (same forms as --data): every --eval-steps, log the teacher-forced masked vs NTP accuracy "
        "on it (see `sbd convergence`)"))
    eval_n: int = field(default=64, metadata=_opt("records of --eval-data used"))
    eval_steps: Optional[int] = field(default=None, metadata=_opt("steps between checks (default: --save-steps)"))
    eval_block_size: int = field(default=16, metadata=_opt("block size of the check"))
    resume: bool = field(default=False, metadata=_opt("continue from the latest checkpoint in --out"))
    overwrite: bool = field(default=False, metadata=_opt(
        "replace the sbd train run already in --out: its checkpoints, metrics.jsonl, sbd_train.json and final "
        "model are deleted before training starts (other files stay). Without it (or --resume) such a --out is "
        "refused"))
    progress: bool = field(default=True, metadata=_opt("show a progress bar"))

    resume_keys = ("data", "mode", "adapter", "rank", "alpha", "kl_weight", "latent_weight", "schedule", "steps", "batch_size", "grad_accum", "lr", "warmup_steps", "max_len",
                   "block_size_min", "block_size_max", "block_size", "mask_rate", "align_to_completion",
                   "last_block", "suffix_share", "noisy_blocks", "train_layers_from", "position_decay",
                   "sampler_head", "sampler_head_only", "sampler_head_width", "sampler_head_state",
                   "sampler_head_weight", "group_by_length", "seed")

    def __post_init__(self):
        # a Path is kept as the text the run records; frozen, so these are its only writes, before any check
        for name in ("model", "data", "out"):
            object.__setattr__(self, name, str(getattr(self, name)))
        if self.eval_data is not None:
            object.__setattr__(self, "eval_data", str(self.eval_data))
        self.validate()

    def validate(self) -> None:
        """SBDError naming the option for any value a run cannot use (nothing is loaded yet)."""
        def positive(name, value):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SBDError(f"--{name.replace('_', '-')} must be >= 1, got {value!r}")

        for name in ("rank", "steps", "batch_size", "grad_accum", "save_steps", "logging_steps", "eval_n", "eval_steps",
                     "eval_block_size", "block_size"):
            positive(name, getattr(self, name))
        if not isinstance(self.lr, (int, float)) or not math.isfinite(self.lr) or self.lr <= 0:
            raise SBDError(f"--lr must be a positive number, got {self.lr}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise SBDError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        if self.warmup >= self.steps:  # both schedules decay only after the warmup: here they never would
            raise SBDError(f"--warmup-steps {self.warmup} leaves no step of --steps {self.steps} for --schedule "
                           f"{self.schedule} to decay in (the learning rate would rise for the whole run); use "
                           f"--warmup-steps {self.steps - 1} or less, or more --steps")
        if self.adapter is not None and self.mode != "sbd":
            raise SBDError("--adapter trains drafts for SBD; it cannot be combined with --mode ntp")
        if not isinstance(self.alpha, (int, float)) or not math.isfinite(self.alpha) or self.alpha <= 0:
            raise SBDError(f"--alpha must be a positive number, got {self.alpha}")
        check_adapter_options(CLI, adapter=self.adapter is not None, head_only=self.sampler_head_only,
                              kl_weight=self.kl_weight, latent_weight=self.latent_weight,
                              grad_layer=self.train_layers_from, position_decay=self.position_decay)
        if self.max_len is not None and self.max_len < 2:
            raise SBDError(f"--max-len must be >= 2, got {self.max_len}")
        if not 1 <= self.block_size_min <= self.block_size_max:
            raise SBDError(f"need 1 <= --block-size-min <= --block-size-max, got {self.block_size_min} and "
                           f"{self.block_size_max}")
        if self.mask_rate is not None and not 0 < self.mask_rate <= 1:
            raise SBDError(f"--mask-rate must lie in (0, 1], got {self.mask_rate}")
        if not 0 <= self.suffix_share <= 1:
            raise SBDError(f"--suffix-share must lie in [0, 1], got {self.suffix_share}")
        if self.noisy_blocks is not None and (not isinstance(self.noisy_blocks, int) or self.noisy_blocks < 1):
            raise SBDError(f"--noisy-blocks must be >= 1, got {self.noisy_blocks!r}")
        self._validate_head()
        if self.resume and self.overwrite:
            raise SBDError("--resume (continue the run in --out) and --overwrite (replace it) cannot be combined; "
                           "give one of them")
        if self.noisy_blocks is not None and self.attention == "flex":
            raise SBDError("--noisy-blocks needs the dense SDPA mask; it cannot be combined with --attention flex")
        if self.save_total_limit < 0:
            raise SBDError(f"--save-total-limit must be >= 0, got {self.save_total_limit}")
        for name, choices in (("mode", ("sbd", "ntp")), ("last_block", ("eos", "drop")),
                              ("attention", ("auto", "sdpa", "flex"))):
            if getattr(self, name) not in choices:
                raise SBDError(f"--{name.replace('_', '-')} must be one of {', '.join(choices)}, "
                               f"got {getattr(self, name)!r}")

    def _validate_head(self) -> None:
        heads = self.sampler_head or self.sampler_head_only
        if (heads or self.sampler_head_width is not None or self.sampler_head_weight != 1.0) and self.adapter is None:
            raise SBDError("--sampler-head, --sampler-head-only, --sampler-head-width and --sampler-head-weight "
                           "apply to --adapter runs only")
        if self.sampler_head and self.sampler_head_only:
            raise SBDError("choose one of --sampler-head (train it with the adapter) and --sampler-head-only "
                           "(train it alone over a frozen adapter)")
        if (self.sampler_head_width is not None or self.sampler_head_weight != 1.0 or self.sampler_head_state) \
                and not heads:
            raise SBDError("--sampler-head-width, --sampler-head-state and --sampler-head-weight need --sampler-head "
                           "or --sampler-head-only")
        w = self.sampler_head_width
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
            raise SBDError(f"--sampler-head-width must be >= 1, got {w!r}")
        v = self.sampler_head_weight
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise SBDError(f"--sampler-head-weight must be a positive number, got {v!r}")
        if self.sampler_head_only and self.sampler_head_weight != 1.0:
            raise SBDError("--sampler-head-weight weighs the head against the masked loss; --sampler-head-only "
                           "has no masked loss to weigh against")

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else min(200, self.steps // 10)

    def settings(self) -> dict:
        """What `RUN_FILE` records: the settings a resume must match, and the start model."""
        return {**{k: getattr(self, k) for k in self.resume_keys}, "model": self.model}


def _is_main_process() -> bool:
    """Rank 0 of a torchrun / accelerate launch, or a plain single-process run."""
    return os.environ.get("RANK", "0") == "0"


def _check_paths(config: TrainConfig) -> TrainConfig:
    """Checks the paths and lengths before anything is loaded; returns the config the run goes on with
    (--max-len filled in from the model's context where it was not given)."""
    for flag, spec in (("--data", config.data), ("--eval-data", config.eval_data)):
        if spec is not None and not spec.startswith(RG_PREFIX) and not Path(spec).is_file():
            raise SBDError(f"{flag} file {spec!r} does not exist")
    out, model = Path(config.out), Path(config.model)
    if out.exists() and not out.is_dir():
        raise SBDError(f"--out {config.out!r} exists and is not a folder")
    if any(p.is_file() for p in out.parents if p != Path(".")):
        raise SBDError(f"--out {config.out!r} lies under a file")
    if model.exists() and out.exists() and out.resolve() == model.resolve():
        raise SBDError(f"--out is the --model folder {config.model!r}: the run would overwrite the model it starts "
                       "from; choose another --out")
    if (out / "config.json").is_file() and not (out / RUN_FILE).is_file():
        raise SBDError(f"--out {config.out!r} holds a model that no sbd train run made; choose another --out")
    if config.attention == "flex":
        import torch

        if not torch.cuda.is_available():
            raise SBDError("--attention flex needs a CUDA GPU (flex_attention trains on CUDA only); on this machine "
                           "use --attention auto or sdpa")
    return _check_lengths(config)


def _check_lengths(config: TrainConfig) -> TrainConfig:
    """Block sizes against --max-len and the model's context, --max-len against the context, and the
    dense training mask against memory, before anything is loaded. Returns `config` with --max-len
    filled in (1024, or the model's context if that is shorter) where it was not given."""
    largest = config.block_size or config.block_size_max
    context = None
    try:
        cfg = json.loads((Path(config.model) / "config.json").read_text(encoding="utf-8"))
        cfg = cfg.get("text_config", cfg)
        context = min(int(v) for v in (cfg.get("max_position_embeddings"), cfg.get("sliding_window"))
                      if isinstance(v, int) and v > 0)
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # sbd.load names a missing or broken config later
    max_len = config.max_len
    if max_len is None:
        max_len = min(DEFAULT_MAX_LEN, context or DEFAULT_MAX_LEN)
    elif context is not None and max_len > context:
        raise SBDError(f"--max-len {max_len} exceeds the model's context of {context} positions; "
                       f"use --max-len {context} or less")
    if largest > max_len:
        raise SBDError(f"block size {largest} exceeds --max-len {max_len}: a block must fit in a sequence")
    # the doubled sequence is at most max_len + (max_len rounded up to a block) long; its dense bool mask
    # is (batch, T, T) bytes on CPU
    t = max_len + -(-max_len // largest) * largest
    mask_bytes = config.batch_size * t * t
    if mask_bytes > 8 * 2**30:
        raise SBDError(f"--batch-size {config.batch_size} at --max-len {max_len} needs a {mask_bytes / 2**30:.0f} "
                       "GiB attention mask per micro-batch; lower --max-len or --batch-size")
    return config if max_len == config.max_len else replace(config, max_len=max_len)


# what a run writes into --out besides its checkpoints: its settings, its log, and the final model (weights,
# config, tokenizer; a drafting adapter's files instead of the weights and config for --adapter runs)
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
               "training_args.bin", "adapter_config.json", "adapter_model.safetensors", "sampler_head_config.json",
               "sampler_head.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "added_tokens.json", "chat_template.jinja", "tokenizer.model", "vocab.json", "merges.txt")


def _finished(out: Path) -> bool:
    """--out holds the final model of an sbd train run (its settings beside it)."""
    return (out / RUN_FILE).is_file() and any((out / name).is_file() for name in ("config.json", "adapter_config.json"))


def _previous_run(out: Path) -> str | None:
    """What an earlier sbd train run left in `out`, in a few words; None when it left nothing."""
    from .checkpoints import latest_checkpoint

    latest = latest_checkpoint(out)
    if _finished(out):
        return "a finished run: its final model" + (f" and checkpoints up to {latest.name}" if latest else "")
    if latest is not None:
        return f"checkpoints up to {latest.name}"
    left = [name for name in (RUN_FILE, METRICS_FILE) if (out / name).is_file()]
    if left:
        return f"stopped before its first checkpoint: {', '.join(left)}"
    return None


def _clear_previous_run(out: Path) -> None:
    """--overwrite: delete what an earlier run wrote into `out` (checkpoints, settings, log, final model)."""
    import shutil

    from .checkpoints import PATTERN, STAGING

    for path in sorted(out.iterdir()) if out.is_dir() else ():
        if path.is_dir() and (PATTERN.match(path.name) or path.name == STAGING):
            shutil.rmtree(path)
        elif path.is_file() and (path.name in (RUN_FILE, METRICS_FILE, *MODEL_FILES)
                                 or (path.name.startswith("model-") and path.name.endswith(".safetensors"))):
            path.unlink()


def _resume_point(config: TrainConfig) -> str | None:
    """Checks --out against --resume and --overwrite; returns the checkpoint to resume from: the newest
    intact one (a damaged newer one is named on stderr in one line and passed over)."""
    import sys

    from .checkpoints import latest_checkpoint, latest_intact

    out = Path(config.out)
    if config.overwrite:
        return None
    latest = latest_checkpoint(out)
    if not config.resume:
        found = _previous_run(out)
        if found is not None:
            raise SBDError(f"--out {config.out!r} already holds an sbd train run ({found}); pass --resume to "
                           "continue it, --overwrite to replace it, or choose another --out")
        return None
    if latest is None:
        if _finished(out):
            raise SBDError(f"--resume: {config.out!r} holds a finished run and no checkpoint to continue from; "
                           f"train its model further with --model {config.out} and another --out, or replace the "
                           "run with --overwrite instead of --resume")
        if _previous_run(out) is not None:
            raise SBDError(f"--resume: no checkpoint in {config.out!r} (its run stopped before the first one); "
                           "start it again with --overwrite instead of --resume")
        raise SBDError(f"--resume: no checkpoint in {config.out!r}")
    intact, damaged = latest_intact(out)
    if intact is None:
        names = "; ".join(f"{p.name}: {why}" for p, why in damaged)
        raise SBDError(f"--resume: every checkpoint in {config.out!r} is damaged ({names}); start a new run")
    if damaged and _is_main_process():
        for path, why in damaged:
            print(f"sbd: {path} is damaged ({why}); resuming from {intact.name}", file=sys.stderr)
    saved = out / RUN_FILE
    if saved.is_file():
        try:
            before = json.loads(saved.read_text(encoding="utf-8"))
            if not isinstance(before, dict):
                raise ValueError
        except (OSError, ValueError, UnicodeDecodeError):
            raise SBDError(f"{saved} is damaged (not a JSON object of settings); it records the run's settings, "
                           f"so --resume cannot check them: restore it or start a new --out") from None
        now = config.settings()
        changed = [k for k in config.resume_keys if k in before and before[k] != now[k]]
        if changed:
            k = changed[0]
            raise SBDError(f"--resume with a different --{k.replace('_', '-')} ({now[k]!r}, the run used "
                           f"{before[k]!r}); resume with the same settings or use another --out")
    return str(intact)


def train(config: TrainConfig) -> Path:
    """Run `config` to the end and return the folder of the trained model (`config.out`).

    Ctrl-C saves a checkpoint and raises KeyboardInterrupt, SIGTERM the same and raises
    `sbd.interrupts.Terminated` (a KeyboardInterrupt); resume with `resume=True`. A NaN/inf loss or
    gradient norm raises SBDError and saves nothing after it. User mistakes raise SBDError before any
    model is loaded where possible.
    """
    config = _check_paths(config)  # the resolved config: the one the run uses and records
    try:
        if not _is_main_process():
            return _run(config)
        from .run_lock import run_lock

        with run_lock(config.out):  # a second run on the same folder is refused; a crash releases the lock
            return _run(config)
    except OSError as e:  # a read-only or full disk, a missing permission: name the path and the reason
        where = e.filename or config.out
        if str(Path(config.out).resolve()) not in str(Path(str(where)).resolve()):
            raise
        raise SBDError(f"cannot write {where}: {e.strerror or e} (checkpoints already in {config.out} are "
                       "intact; free space or fix permissions, then --resume)") from None


def _head_mode(config: TrainConfig) -> str | None:
    """SBDTrainer's sampler_head: "only", "joint" or None."""
    return "only" if config.sampler_head_only else "joint" if config.sampler_head else None


def _setup_head(model, config: TrainConfig, warm: bool) -> None:
    """Attach, continue or drop the sampler head as the options ask (after the adapter is in place)."""
    from ..drafters import sampler_head as heads

    head = heads.head_of(model)
    if not (config.sampler_head or config.sampler_head_only):
        if head is not None:  # a head trained for the adapter as it was; the adapter is about to change
            heads.detach(model)
            print(f"the sampler head of {config.model} is not carried over (train one with --sampler-head)")
        return
    if config.sampler_head_only and not warm:
        raise SBDError("--sampler-head-only trains a head over a trained drafting adapter: give the adapter's "
                       "folder as --model (or use --sampler-head to train both)")
    if head is None:
        heads.attach(model, heads.SamplerHeadConfig(width=config.sampler_head_width or heads.DEFAULT_WIDTH,
                                                    state=config.sampler_head_state))
    elif config.sampler_head_width not in (None, head.config.width):
        raise SBDError(f"--model's sampler head has width {head.config.width}; give --sampler-head-width "
                       f"{head.config.width} (or none) to continue it")
    else:
        gains = config.sampler_head_state and head.carry is None
        if gains:
            heads.add_state(model)
        print(f"continuing the sampler head of {config.model} (its weights are the starting point"
              f"{'; it gains a state, at zero' if gains else ''})")
    heads.head_of(model).requires_grad_(True)


def _run(config: TrainConfig) -> Path:
    resume_from = _resume_point(config)

    import torch

    from ..models.loading import add_mask_token, load
    from .collator import SBDDataCollator
    from .data import load_records, tokenize_records
    from .trainer import SBDTrainer, sbd_training_args

    records = load_records(config.data)
    cuda = torch.cuda.is_available()
    model, tokenizer = load(config.model, device="cuda" if cuda else "cpu", dtype=torch.float32, weights="float")
    from transformers import set_seed

    set_seed(config.seed)  # what is drawn before the Trainer seeds itself: a new mask embedding, adapter, head
    if cuda and config.adapter is None and config.attention in ("auto", "flex") and config.noisy_blocks is None:
        try:
            model.set_attn_implementation("flex_attention")
        except Exception as e:  # an architecture without flex support keeps SDPA
            if config.attention == "flex":
                raise SBDError(f"this model cannot use flex_attention: {str(e).splitlines()[0]}") from None
    mask_id = add_mask_token(model, tokenizer)
    from ..drafters import adapter as adapters

    start = adapters.adapter_of(model)  # --model was an adapter folder (or a packaged model with its adapter)
    if start is not None and config.adapter is None:
        raise SBDError(f"--model {config.model!r} is a drafting adapter: continue training it with --adapter lora, "
                       "or give its base model to fine-tune all weights")
    if config.adapter is not None:
        model.requires_grad_(False)  # the model stays exactly itself; only the adapter learns
        if start is None:
            from .adapter_setup import base_name, check_fits

            check_fits(model, config.rank, adapters.DEFAULT_TARGETS)  # before a byte of it is allocated
            adapters.attach(model, adapters.AdapterConfig(
                r=config.rank, lora_alpha=float(config.alpha), block_size=config.block_size or config.block_size_max,
                base_model_name_or_path=base_name(config.model)))
        elif config.sampler_head_only:  # the adapter stays exactly as it is; only a head trains over it
            print(f"training a sampler head over the drafting adapter of {config.model} (the adapter is unchanged)")
        else:  # warm start: training goes on from the adapter's weights (new data, more steps)
            if (start.config.r, float(start.config.lora_alpha)) != (config.rank, float(config.alpha)):
                raise SBDError(f"--model's adapter has rank {start.config.r} and alpha {start.config.lora_alpha:g}; "
                               f"give --rank {start.config.r} --alpha {start.config.lora_alpha:g} to continue it")
            start.config.block_size = config.block_size or config.block_size_max
            start.requires_grad_(True)
            print(f"continuing the drafting adapter of {config.model} (its weights are the starting point)")
        if config.train_layers_from:
            from .adapter_forward import freeze_below

            freeze_below(model, config.train_layers_from)
        _setup_head(model, config, start is not None)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dataset = tokenize_records(records, tokenizer, config.max_len, mask_id)
    heldout = None
    if config.eval_data is not None:
        held = tokenize_records(load_records(config.eval_data)[: config.eval_n], tokenizer, config.max_len, mask_id)
        heldout = [held[i] for i in range(len(held))]
    collator = SBDDataCollator(tokenizer, mask_token_id=mask_id, block_size=config.block_size,
                               mask_rate=config.mask_rate, block_size_range=(config.block_size_min, config.block_size_max),
                               align_to_completion=config.align_to_completion, last_block=config.last_block,
                               suffix_share=config.suffix_share, noisy_blocks=config.noisy_blocks)
    training_args = sbd_training_args(
        config.out, steps=config.steps, batch_size=config.batch_size, lr=config.lr, warmup_steps=config.warmup,
        grad_accum=config.grad_accum, seed=config.seed, save_steps=config.save_steps, schedule=config.schedule,
        save_total_limit=config.save_total_limit or None, logging_steps=config.logging_steps,
        **({"train_sampling_strategy": "group_by_length"} if config.group_by_length else {}))
    out = Path(config.out)
    trainer = SBDTrainer(model, training_args, data_collator=collator, train_dataset=dataset,
                         processing_class=tokenizer, mode="adapter" if config.adapter else config.mode,
                         kl_weight=config.kl_weight, latent_weight=config.latent_weight,
                         grad_layer=config.train_layers_from,
                         position_decay=config.position_decay, metrics_file=out / METRICS_FILE,
                         sampler_head=_head_mode(config),
                         sampler_head_weight=config.sampler_head_weight, bf16=config.bf16,
                         show_progress=config.progress, convergence_examples=heldout,
                         convergence_steps=config.eval_steps, convergence_block_size=config.eval_block_size)
    main = trainer.is_world_process_zero()
    if main:
        if config.overwrite and _previous_run(out) is not None:
            _clear_previous_run(out)
            print(f"replacing the earlier run in {out} (--overwrite)")
        out.mkdir(parents=True, exist_ok=True)
        (out / RUN_FILE).write_text(json.dumps(config.settings(), indent=1))
    record_decodings(model, config)  # before training: every checkpoint says what it is being trained for
    trainer.train(resume_from_checkpoint=resume_from)
    step = trainer.state.global_step
    if trainer.interrupted:
        import signal

        from ..interrupts import Terminated

        term = trainer.stop_signal == signal.SIGTERM
        if main:
            print(f"stopped at step {step}{' by SIGTERM' if term else ''}: checkpoint saved in "
                  f"{out / f'checkpoint-{step}'}; continue with the same command and --resume", flush=True)
        raise Terminated if term else KeyboardInterrupt
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    trainer.save_model(str(out))  # weights (safetensors), config with sbd_mask_token_id, tokenizer
    if main:
        what = "drafting adapter" if config.adapter else "model"
        print(f"trained {step} steps ({'adapter' if config.adapter else config.mode}); {what} saved to {out} — "
              f"try: sbd generate --model {out} --method sbd-verify \"...\"")
    return out


def record_decodings(model, config: TrainConfig) -> None:
    """What the trained drafter is fit for (`sbd.decoding.trained_for`), saved with it: with every block
    position masked (mask rate 1) only sbd-verify's drafts; with partially revealed blocks plain SBD too;
    the NTP recipe neither."""
    decodings = ["sbd-verify"] if config.mask_rate == 1 else ["sbd", "sbd-verify"]
    if config.adapter:
        from ..drafters.adapter import adapter_of

        adapter_of(model).config.trained_for = decodings
    else:
        model.config.sbd_trained_for = decodings if config.mode == "sbd" else []
