"""`sbd train`: fine-tune a model with the SBD recipe (or the NTP baseline).

The options are generated from `sbd.training.run.TrainConfig`; the run is `sbd.training.run.train`.
Runs unchanged under `torchrun` / `accelerate launch` for data-parallel training.
"""

from __future__ import annotations

import sys

from ..interrupts import TERM_STATUS, Terminated
from ..training.run import TrainConfig, train
from .args import add_config_options, config_from_args


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="fine-tune a model for set block decoding (or the NTP baseline)",
                       description="Fine-tune a local Hugging Face causal LM with the SBD recipe: the doubled "
                                   "sequence [x | masked x], NTP + MATP loss, block size drawn per step. Writes "
                                   "checkpoints, metrics.jsonl and a final model folder that `sbd generate` uses. "
                                   "Ctrl-C (exit status 130) or SIGTERM (exit status 143, what schedulers send) "
                                   "saves a checkpoint; the same command with --resume continues.")
    add_config_options(p, TrainConfig)


def cmd_train(args) -> None:
    try:
        train(config_from_args(TrainConfig, args))
    except Terminated:  # the checkpoint is saved and named on stdout; a scheduler reads the status
        print("sbd: terminated", file=sys.stderr, flush=True)
        raise SystemExit(TERM_STATUS) from None
