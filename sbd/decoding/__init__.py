"""Decoding: `generate` (the API), the NTP and SBD loops, and the preallocated KV cache they share."""

from .generate import GenerationResult, generate

__all__ = ["GenerationResult", "generate"]
