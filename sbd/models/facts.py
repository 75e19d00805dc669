"""What decoding needs to know about a loaded model, read in one place: how long a sequence it takes,
its vocabulary, its SBD mask token, the block size its drafter was trained for, its EOS ids, where it
runs, and the decoding configuration it records as measured best.

`generate`, the server, lm-eval and the benchmarks read these through `ModelFacts.of(model, tokenizer)`
instead of each asking the model's config again.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from ..drafters.adapter import adapter_of
from ..errors import SBDError
from .quantized import held_weights, weights_format

FALLBACK_BLOCK = 16  # the block size of a model whose drafter records none


def context_limit(model) -> int | None:
    """Longest sequence the model's positions and attention support (sliding windows count)."""
    cfg = model.config.get_text_config(decoder=True)
    limits = [getattr(cfg, "max_position_embeddings", None), getattr(cfg, "sliding_window", None)]
    limits = [int(x) for x in limits if isinstance(x, int) and x > 0]
    return min(limits) if limits else None


def default_eos_ids(model, tokenizer) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config (which may list several)."""
    ids: set[int] = set()
    for source in (getattr(tokenizer, "eos_token_id", None),
                   getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(x) for x in source)
    return sorted(ids)


def recorded_block_size(model) -> int | None:
    """The block size a fully fine-tuned SBD model records as its measured best (`sbd_decoding` in its
    config.json), if any; an adapter's trained block size comes first (`default_block_size`)."""
    record = getattr(getattr(model, "config", None), "sbd_decoding", None)
    size = record.get("block_size") if isinstance(record, dict) else None
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise SBDError(f"the model's config.json (sbd_decoding): block_size is an integer >= 1, got {size!r}")
    return size


def default_block_size(model) -> int:
    """The block size a drafting adapter attached to `model` was trained for, else the one the model
    records as measured best, else 16."""
    adapter = adapter_of(model)
    if adapter is not None:
        return int(adapter.config.block_size)
    return recorded_block_size(model) or FALLBACK_BLOCK


def decoding_record(model) -> tuple[dict, str] | None:
    """The measured decoding configuration the model records, and where: its drafting adapter's
    `adapter_config.json` ("decoding"), else its config.json ("sbd_decoding"); None when neither does."""
    adapter = adapter_of(model)
    record = getattr(adapter.config, "decoding", None) if adapter is not None else None
    if record:
        return record, "the drafting adapter's adapter_config.json"
    record = getattr(getattr(model, "config", None), "sbd_decoding", None)
    if record:
        return record, "the model's config.json (sbd_decoding)"
    return None


@dataclass(frozen=True)
class ModelFacts:
    """A loaded model as decoding sees it (module docstring). context: None when the config names no
    limit; mask_id: None for a model without the SBD mask token; eos_ids: () without a tokenizer's or
    generation config's EOS."""

    context: int | None
    vocab: int
    mask_id: int | None
    block_size: int
    eos_ids: tuple[int, ...]
    device: torch.device
    weights: str | None = None  # "int8"/"int4" when quantized (`sbd.models.quantized`): row-invariant layers
    held: str = ""  # what the user is told of the weights (`quantized.held_weights`: "int4, exactly as stored")

    @classmethod
    def of(cls, model, tokenizer=None) -> "ModelFacts":
        embeddings = model.get_input_embeddings()
        mask_id = getattr(model.config, "sbd_mask_token_id", None)
        fmt = weights_format(model)
        return cls(context=context_limit(model), vocab=int(embeddings.num_embeddings), mask_id=mask_id,
                   block_size=default_block_size(model), eos_ids=tuple(default_eos_ids(model, tokenizer)),
                   device=embeddings.weight.device, weights=fmt, held=held_weights(model, fmt))

    def end_ids(self, given=None) -> tuple[int, ...]:
        """The end tokens a call decodes with: `given` (a caller's `eos_token_ids`, each a token id of this
        vocabulary, else SBDError in one line), or the tokenizer's and generation config's when None."""
        if given is None:
            return self.eos_ids
        if isinstance(given, (str, bytes, dict)) or not hasattr(given, "__iter__"):
            raise SBDError(f"eos_token_ids is a list of token ids (or [] to decode to the budget), got {given!r}")
        ids = []
        for t in given:
            try:
                if isinstance(t, bool):
                    raise TypeError
                ids.append(operator.index(t))
            except TypeError:
                raise SBDError(f"eos_token_ids holds {t!r}, which is not a token id") from None
            if not 0 <= ids[-1] < self.vocab:
                raise SBDError(f"eos_token_ids holds {ids[-1]}, which lies outside the model's vocabulary of "
                               f"{self.vocab} (ids 0..{self.vocab - 1})")
        return tuple(ids)
