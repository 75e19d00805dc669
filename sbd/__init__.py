"""sbd — Set Block Decoding for Hugging Face causal language models."""

from . import masks, sampler
from .errors import SBDError
from .generate import GenerationResult, generate
from .loading import add_mask_token, load
from .training import SBDDataCollator

__all__ = ["GenerationResult", "SBDDataCollator", "SBDError", "SBDTrainer", "add_mask_token", "generate", "load",
           "masks", "sampler"]
__version__ = "0.1.0"


def __getattr__(name):
    if name == "SBDTrainer":  # lazy: importing transformers.Trainer takes seconds
        from .training.trainer import SBDTrainer

        return SBDTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
