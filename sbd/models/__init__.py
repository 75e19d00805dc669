"""Models: loading a local Hugging Face model (or the shipped demo), its conformance probe, the mask
token, and small random models for tests and experiments."""

from .folders import add_mask_token
from .loading import load

__all__ = ["add_mask_token", "load"]
