"""sbd — Set Block Decoding for Hugging Face causal language models.

Where things live (imports point one way, down this list):
  sbd.cli          the `sbd` command: parsing and printing only
  sbd.experiment   the small-scale paper experiment (calls training.run and evaluation)
  sbd.evaluation   accuracy / NFE / wall-clock of decoding; the teacher-forced convergence check
  sbd.benchmarking sbd bench, forward-cost timing, the roofline (the paper's and a corrected one)
  sbd.training     the SBD recipe: collator, loss, SBDTrainer, `train(TrainConfig)`
  sbd.decoding     `generate`, `DecodeSpec` (how to decode, resolved in one place), the rows, the KV cache
  sbd.models       `load`, the conformance probe, `add_mask_token`, tiny random models
  sbd.drafters     what a drafter ships: the drafting adapter and the sampler head (config, folder, attach)
  sbd.tasks        seeded reasoning tasks with worked solutions and their scorers
  sbd.sampler, sbd.masks   the EB rule and the attention masks (the method's two rules); sbd.modes
"""

from ._version import __version__  # noqa: F401 (sbd.__version__)
from .errors import SBDError

__all__ = ["DecodeSpec", "GenerationResult", "SBDDataCollator", "SBDError", "SBDTrainer", "add_mask_token", "generate", "load",
           "masks", "sampler"]

# The public names load on first use: `import sbd` stays light (the console command takes over Ctrl-C
# before torch is imported), and importing transformers.Trainer (SBDTrainer) takes seconds.
_LAZY = {"DecodeSpec": "decoding", "GenerationResult": "decoding", "generate": "decoding", "add_mask_token": "models", "load": "models",
         "SBDDataCollator": "training", "SBDTrainer": "training.trainer", "masks": None, "sampler": None}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    where = _LAZY[name]
    if where is None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value
    return value
