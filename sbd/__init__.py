"""sbd — Set Block Decoding for Hugging Face causal language models.

Where things live (imports point one way, down this list):
  sbd.cli          the `sbd` command: parsing and printing only
  sbd.experiment   the small-scale paper experiment (calls training.run and evaluation)
  sbd.evaluation   accuracy / NFE / wall-clock of decoding; the teacher-forced convergence check
  sbd.benchmarking sbd bench, forward-cost timing, the roofline (the paper's and a corrected one)
  sbd.training     the SBD recipe: collator, loss, SBDTrainer, `train(TrainConfig)`
  sbd.decoding     `generate`, the NTP and SBD loops, the KV cache
  sbd.models       `load`, the conformance probe, `add_mask_token`, tiny random models
  sbd.tasks        seeded reasoning tasks with worked solutions and their scorers
  sbd.sampler, sbd.masks   the EB rule and the attention masks (the method's two rules); sbd.modes
"""

from . import masks, sampler
from ._version import __version__  # noqa: F401 (sbd.__version__)
from .decoding import GenerationResult, generate
from .errors import SBDError
from .models import add_mask_token, load
from .training import SBDDataCollator

__all__ = ["GenerationResult", "SBDDataCollator", "SBDError", "SBDTrainer", "add_mask_token", "generate", "load",
           "masks", "sampler"]


def __getattr__(name):
    if name == "SBDTrainer":  # lazy: importing transformers.Trainer takes seconds
        from .training.trainer import SBDTrainer

        return SBDTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
