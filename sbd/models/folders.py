"""Writing a pretrained model (`sbd.models.sources`) as a folder that `sbd.load` accepts, and giving a model
its SBD mask token."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..errors import SBDError
from .sources import read_source

RESERVED = re.compile(r"reserved|unused", re.IGNORECASE)
MASK_TOKEN = "<|mask|>"


def write_folder(source: str, out, dtype: torch.dtype = torch.float32, mask_token: bool = True) -> Path:
    """Read `source` (`sbd.models.sources.resolve_source`: a .gguf file, a model folder or a packaged
    model), add an SBD mask token and save it to the empty folder `out`, which `load` then accepts."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise SBDError(f"output folder {str(out)!r} is not empty")
    model, tokenizer = read_source(source, dtype)
    if mask_token:
        add_mask_token(model, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _reserved_token(tokenizer, n_embeddings: int) -> int | None:
    """The lowest-id reserved/unused special token the embedding table already has, if any."""
    candidates = [i for tok, i in tokenizer.get_added_vocab().items() if RESERVED.search(tok) and i < n_embeddings]
    return min(candidates) if candidates else None


def add_mask_token(model, tokenizer) -> int:
    """Give `model` a mask token and record its id as `model.config.sbd_mask_token_id`.

    Reuses the tokenizer's mask token or a reserved/unused special token when there is one;
    otherwise adds `<|mask|>` and resizes the embeddings. Idempotent.
    """
    existing = getattr(model.config, "sbd_mask_token_id", None)
    if existing is not None:
        return int(existing)
    n_embeddings = model.get_input_embeddings().num_embeddings
    mask_id = tokenizer.mask_token_id if getattr(tokenizer, "mask_token", None) else None
    if mask_id is None or mask_id >= n_embeddings:
        mask_id = _reserved_token(tokenizer, n_embeddings)
    if mask_id is None:
        tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
        mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        if mask_id >= n_embeddings:
            model.resize_token_embeddings(mask_id + 1, mean_resizing=False)
            with torch.no_grad():  # deterministic: the mean of the existing rows (no random draw per import)
                emb = model.get_input_embeddings().weight
                emb[n_embeddings:] = emb[:n_embeddings].mean(0)
                out = model.get_output_embeddings()
                if out is not None and out.weight is not emb:
                    out.weight[n_embeddings:] = out.weight[:n_embeddings].mean(0)
    elif getattr(tokenizer, "mask_token", None) is None:
        tokenizer.mask_token = tokenizer.convert_ids_to_tokens(mask_id)
    model.config.sbd_mask_token_id = int(mask_id)
    return int(mask_id)
