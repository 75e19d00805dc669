"""sbd — Set Block Decoding for Hugging Face causal language models."""

from . import masks, sampler
from .errors import SBDError
from .generate import GenerationResult, generate
from .loading import add_mask_token, load

__all__ = ["GenerationResult", "SBDError", "add_mask_token", "generate", "load", "masks", "sampler"]
__version__ = "0.1.0"
