"""Decoding: `generate` (the API), the engine that batches rows each at its own pace, the rows (NTP,
SBD, sbd-verify) and the preallocated KV caches they use."""

from .generate import GenerationResult, generate
from .spec import DecodeSpec

__all__ = ["DecodeSpec", "GenerationResult", "generate"]
