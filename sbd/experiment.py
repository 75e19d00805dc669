"""`sbd experiment`: the paper's protocol at a scale this machine can train, with the project's own commands.

Phases (each writes one folder under --out and is skipped when already complete, so an interrupted
run continues where it stopped; an interrupted training phase resumes from its last checkpoint):

  data      seeded train split of the tasks, rendered as prompt -> worked solution (jsonl)
  init      a small random Llama and a byte-level BPE tokenizer trained on the task text
  pretrain  NTP training from scratch (`sbd train --mode ntp`); skipped when the scale has no pretraining,
            and the two runs below then start from the random model (SBD loss from the start)
  ntp, sbd  two trainings of the same start model, same steps and data order: the NTP baseline and SBD;
            both log the held-out masked vs NTP accuracy (`sbd convergence`) as they go
  release   fp16 copies of both: the exact files that are evaluated and shipped
  eval      NTP-trained model with NTP decoding; SBD-trained model with NTP decoding and SBD at each γ;
            the convergence check of both models

Results: results/results.json, results.md (Table 1 layout) and accuracy_vs_speedup.png, plus
experiment.json with the scale, the command and the wall time of each phase.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import SBDError

PHASES = ("data", "init", "pretrain", "ntp", "sbd", "release", "eval")
DONE = ".done"


@dataclass(frozen=True)
class Scale:
    """Everything that sets the size and cost of one experiment run."""

    tasks: tuple[str, ...]
    train_per_task: int
    eval_per_task: int
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    pretrain_steps: int
    finetune_steps: int
    batch_size: int
    pretrain_lr: float
    finetune_lr: float
    gammas: tuple[float, ...] = (0.0, 0.1, 0.35, 0.6, 1.0)
    block_size: int = 16
    max_new_tokens: int = 112
    max_len: int = 160
    repeats: int = 3
    eval_batch_size: int = 1
    align_to_completion: bool = True
    last_block: str = "eos"
    suffix_share: float = 0.0
    heldout_per_task: int = 16     # held-out problems per task for the convergence check logged in training
    check_per_task: int = 50       # ... and for the check of the released models
    seed: int = 0
    extra: dict = field(default_factory=dict)


TASKS = ("chain_sum", "number_sorting", "word_sequence_reversal")
SCALES = {
    # CI: the whole pipeline end to end in seconds; the numbers mean nothing.
    "toy": Scale(tasks=TASKS, train_per_task=30, eval_per_task=2, vocab_size=300, hidden=32, layers=1, heads=2,
                 pretrain_steps=3, finetune_steps=2, batch_size=8, pretrain_lr=1e-3, finetune_lr=1e-3,
                 gammas=(0.0, 1.0), max_new_tokens=16, repeats=1, heldout_per_task=2, check_per_task=2),
    # The recorded experiment: under an hour on 2 CPU cores. No NTP pretraining: the SBD run has the SBD
    # loss from its first step, the NTP baseline the same start, data, order and steps (docs/results.md).
    "tiny": Scale(tasks=TASKS, train_per_task=20000, eval_per_task=200, vocab_size=1024, hidden=256, layers=4,
                  heads=4, pretrain_steps=0, finetune_steps=2000, batch_size=24, pretrain_lr=1e-3,
                  finetune_lr=1e-3, repeats=1),
    # The model-size row of the recipe study: `tiny` with a 2x narrower model (1.3M parameters), same data,
    # steps and learning rate.
    "tiny-h128": Scale(tasks=TASKS, train_per_task=20000, eval_per_task=200, vocab_size=1024, hidden=128,
                       layers=4, heads=4, pretrain_steps=0, finetune_steps=2000, batch_size=24, pretrain_lr=1e-3,
                       finetune_lr=1e-3, repeats=1),
}


class Experiment:
    """One run folder: phase state, timings and the paths of every artefact."""

    def __init__(self, scale_name: str, out, progress: bool = True):
        if scale_name not in SCALES:
            raise SBDError(f"unknown experiment scale {scale_name!r}; choose one of {', '.join(SCALES)}")
        self.name, self.scale, self.out, self.progress = scale_name, SCALES[scale_name], Path(out), progress
        self.out.mkdir(parents=True, exist_ok=True)
        self.record_path = self.out / "experiment.json"
        self.record = json.loads(self.record_path.read_text()) if self.record_path.exists() else {}
        if self.record.get("scale_name", scale_name) != scale_name:
            raise SBDError(f"{str(self.out)!r} holds a {self.record['scale_name']!r} experiment; use another --out")
        self.record.update({"scale_name": scale_name, "scale": asdict(self.scale)})
        self.record.setdefault("phase_seconds", {})

    def path(self, phase: str) -> Path:
        return self.out / phase

    def done(self, phase: str) -> bool:
        return (self.path(phase) / DONE).exists()

    def _save_record(self) -> None:
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=1))
        tmp.replace(self.record_path)

    def run(self) -> dict:
        steps = {"data": self.make_data, "init": self.make_model, "pretrain": self.pretrain,
                 "ntp": lambda: self.finetune("ntp"), "sbd": lambda: self.finetune("sbd"),
                 "release": self.release, "eval": self.evaluate}
        self.record["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])  # no local paths
        for i, phase in enumerate(PHASES, 1):
            if self.done(phase):
                print(f"[{i}/{len(PHASES)}] {phase}: done already, skipped")
                continue
            print(f"[{i}/{len(PHASES)}] {phase}", flush=True)
            start = time.perf_counter()
            self.path(phase).mkdir(parents=True, exist_ok=True)
            steps[phase]()
            (self.path(phase) / DONE).write_text("")
            self.record["phase_seconds"][phase] = round(time.perf_counter() - start, 1)
            self._save_record()
        return self.record

    # -- phases ------------------------------------------------------------------------------------
    def make_data(self) -> None:
        from .tasks import render_jsonl

        s = self.scale
        n = render_jsonl(list(s.tasks), "train", s.train_per_task, s.seed, self.path("data") / "train.jsonl")
        render_jsonl(list(s.tasks), "test", s.heldout_per_task, s.seed, self.path("data") / "heldout.jsonl")
        self.record["train_examples"] = n

    def _texts(self) -> list[str]:
        with open(self.path("data") / "train.jsonl", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        return [r["prompt"] + r["completion"] for r in rows]

    def make_model(self) -> None:
        from .models import tiny

        s = self.scale
        texts = self._texts()[: 30 * len(s.tasks) * 100]  # a sample is plenty for a 1k-token BPE
        model, tok = tiny.create(self.path("init"), arch="llama", texts=texts, vocab_size=s.vocab_size,
                                 seed=s.seed, hidden=s.hidden, layers=s.layers, heads=s.heads, kv_heads=s.heads,
                                 context=max(256, s.max_len + s.max_new_tokens))
        self.record["parameters"] = sum(p.numel() for p in model.parameters())

    def _train(self, model: Path, out: Path, mode: str, steps: int, lr: float) -> None:
        from .training.checkpoints import latest_checkpoint
        from .training.run import TrainConfig, train

        s = self.scale
        resume = latest_checkpoint(out) is not None
        train(TrainConfig(
            model=str(model), data=str(self.path("data") / "train.jsonl"), out=str(out), mode=mode, steps=steps,
            batch_size=s.batch_size, lr=lr, max_len=s.max_len, seed=s.seed, save_steps=max(1, steps // 4),
            logging_steps=max(1, min(50, steps // 10)), last_block=s.last_block, suffix_share=s.suffix_share,
            eval_data=str(self.path("data") / "heldout.jsonl"), eval_n=10 ** 6, eval_block_size=s.block_size,
            eval_steps=max(1, steps // 8), align_to_completion=mode == "sbd" and s.align_to_completion,
            resume=resume, overwrite=not resume, progress=self.progress))  # an unfinished phase starts again
        for ckpt in out.glob("checkpoint-*"):  # the final model is in `out`; keep the folder small
            shutil.rmtree(ckpt)

    def pretrain(self) -> None:
        s = self.scale
        if s.pretrain_steps:
            self._train(self.path("init"), self.path("pretrain"), "ntp", s.pretrain_steps, s.pretrain_lr)

    def finetune(self, mode: str) -> None:
        s = self.scale
        start = self.path("pretrain") if s.pretrain_steps else self.path("init")
        self._train(start, self.path(mode), mode, s.finetune_steps, s.finetune_lr)

    def release(self) -> None:
        """fp16 copies of both fine-tunes: what is evaluated is exactly what ships."""
        import torch

        from .models.loading import load

        for mode in ("ntp", "sbd"):
            model, tok = load(self.path(mode), dtype=torch.float32, weights="float")
            dest = self.path("release") / mode
            model.to(torch.float16).save_pretrained(dest)
            tok.save_pretrained(dest)
            meta = {"tasks": list(self.scale.tasks), "seed": self.scale.seed, "trained_with": mode,
                    "experiment": self.name}
            (dest / "sbd_demo.json").write_text(json.dumps(meta, indent=1))

    def evaluate(self) -> None:
        import torch

        from .evaluation import evaluate, write_report
        from .evaluation.report import machine_metadata, model_metadata
        from .models.loading import load

        s = self.scale
        common = dict(tasks=list(s.tasks), n=s.eval_per_task, block_size=s.block_size,
                      max_new_tokens=s.max_new_tokens, batch_size=s.eval_batch_size, repeats=s.repeats,
                      seed=s.seed, progress=self.progress)
        from .training.convergence import convergence_check, heldout_examples

        rows, checks = [], {}
        for mode, label, gammas in (("ntp", "NTP-trained", []), ("sbd", "SBD-trained", list(s.gammas))):
            model, tok = load(self.path("release") / mode, dtype=torch.float32, weights="float")
            examples = heldout_examples(tok, list(s.tasks), s.check_per_task, s.seed, s.max_len)
            checks[mode] = convergence_check(model, examples, block_size=s.block_size, progress=self.progress)
            rows += evaluate(model, tok, gammas=gammas, label=label, **common)
        self.path("eval").mkdir(parents=True, exist_ok=True)
        (self.path("eval") / "convergence.json").write_text(
            json.dumps({mode: c.to_dict() for mode, c in checks.items()}, indent=1))
        (self.path("eval") / "convergence.md").write_text("".join(
            f"## {label}\n\n{checks[mode].to_markdown()}\n" for mode, label in
            (("sbd", "SBD-trained"), ("ntp", "NTP-trained (its mask token never trained)"))))
        from .evaluation.plot import plot_learning_curves

        curves = {}
        for mode, label in (("sbd", "SBD-trained"), ("ntp", "NTP-trained")):
            metrics = self.path(mode) / "metrics.jsonl"
            if metrics.exists():
                curves[label] = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        plot_learning_curves(curves, self.path("eval") / "learning_curves.png")
        meta = {**machine_metadata(), **model_metadata(model), "command": self.record.get("command", ""),
                "experiment": self.name, "phase_seconds": self.record["phase_seconds"]}
        paths = write_report(rows, self.path("eval"), meta)
        self.record["results"] = {k: str(v) for k, v in paths.items()}

    def ship(self, dest: Path) -> None:
        """Copy the released models into the package (`sbd.load("demo")`)."""
        if not self.done("release"):
            raise SBDError("nothing to ship: the release phase has not finished")
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(self.path("release"), dest, ignore=shutil.ignore_patterns(DONE))
        results = self.path("eval") / "results.json"
        if results.exists():
            shutil.copy(results, dest / "results.json")
