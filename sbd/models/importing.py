"""`import_model`: turn a GGUF file (or any local Hugging Face model) into a folder that `sbd.load`
and `sbd train` accept: safetensors weights in a plain dtype, the tokenizer (with its chat template),
and an SBD mask token. Where a model may come from: `sbd.models.sources`.
"""

from __future__ import annotations

import torch

from .folders import write_folder
from .loading import load
from .sources import PACKAGED, resolve_source  # noqa: F401 (the sources `sbd import` accepts)


def import_model(source: str, out, dtype: torch.dtype = torch.float32, mask_token: bool = True):
    """Write `source` as an sbd folder at `out` (`write_folder`) and load it back with `sbd.load`, whose
    conformance probe must pass; returns (model, tokenizer)."""
    write_folder(source, out, dtype=dtype, mask_token=mask_token)
    return load(out)
