"""The SBD data collator (SPEC §2): doubled input [x | x̂], shared positions, 4-D bool mask, labels.

Collation is split in two so that a trainer can draw the randomness itself: `pad` is deterministic
(right padding, lengths, prompt lengths) and `corrupt` turns a padded batch into the model input for a
given block size and given uniforms. `__call__` does both with the collator's own generator, which is
what a Hugging Face user expects from a data collator.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import SBDError

IGNORE = -100
BLOCK_SIZE_RANGE = (2, 16)


def _ids(feature, i: int) -> list[int]:
    if not isinstance(feature, dict) or "input_ids" not in feature:
        raise SBDError(f"example {i} has no 'input_ids' (expected a dict with a list of token ids)")
    ids = feature["input_ids"]
    ids = ids.flatten().tolist() if isinstance(ids, torch.Tensor) else list(ids)
    if not all(isinstance(t, int) for t in ids):
        raise SBDError(f"example {i}: 'input_ids' must be a list of integer token ids")
    if len(ids) < 2:
        raise SBDError(f"example {i} has {len(ids)} token(s); a training sequence needs at least 2")
    return ids


class SBDDataCollator:
    """Turns `{"input_ids": [...], "prompt_length": P}` examples into an SBD training batch.

    block_size / mask_rate: fixed when given, else k ~ U{block_size_range} per call and η ~ U(0,1) per
    sequence. seed: seeds the collator's own generator (None: torch's global generator).
    align_to_completion: the noisy copy holds only the completion, with blocks starting where the
    completion starts (where decoding puts them); the mask stays exact. Off by default (paper layout).
    """

    def __init__(self, tokenizer=None, mask_token_id: int | None = None, block_size: int | None = None,
                 mask_rate: float | None = None, seed: int | None = None,
                 block_size_range: tuple[int, int] = BLOCK_SIZE_RANGE, align_to_completion: bool = False):
        if mask_token_id is None and tokenizer is not None:
            mask_token_id = getattr(tokenizer, "mask_token_id", None)
        if mask_token_id is None:
            raise SBDError("no mask token: pass mask_token_id, or call sbd.add_mask_token(model, tokenizer) first")
        lo, hi = block_size_range
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise SBDError(f"block_size_range must be two integers 1 <= min <= max, got {block_size_range!r}")
        if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
            raise SBDError(f"block_size must be an integer >= 1, got {block_size!r}")
        if mask_rate is not None and not (0.0 <= float(mask_rate) <= 1.0):
            raise SBDError(f"mask_rate must lie in [0, 1], got {mask_rate!r}")
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        if pad is None and tokenizer is not None:
            pad = getattr(tokenizer, "eos_token_id", None)
        self.mask_token_id = int(mask_token_id)
        self.pad_token_id = int(pad) if pad is not None else 0
        self.block_size, self.mask_rate = block_size, mask_rate
        self.block_size_range = (lo, hi)
        self.align_to_completion = align_to_completion
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None

    # -- deterministic part ------------------------------------------------------------------------
    def pad(self, features: Sequence[dict]) -> dict:
        """Right-pad a list of examples: input_ids (B,L), lengths, prompt_lengths, index (dataset ids)."""
        if len(features) == 0:
            raise SBDError("cannot collate an empty list of examples")
        seqs = [_ids(f, i) for i, f in enumerate(features)]
        prompts = []
        for i, (f, s) in enumerate(zip(features, seqs)):
            p = int(f.get("prompt_length", 0) or 0)
            if not 0 <= p < len(s):
                raise SBDError(f"example {i}: prompt_length {p} leaves no completion token in {len(s)} tokens")
            if self.mask_token_id in s:
                raise SBDError(f"example {i} contains the mask token id {self.mask_token_id} in its data")
            prompts.append(p)
        length = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), length), self.pad_token_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        index = [int(f.get("index", -1)) for f in features]
        return {"input_ids": ids, "lengths": torch.tensor([len(s) for s in seqs]),
                "prompt_lengths": torch.tensor(prompts), "index": torch.tensor(index)}

    def noisy_length(self, clean: dict) -> int:
        """Length M of the noisy copy: L, or the longest completion when aligned to completions."""
        if not self.align_to_completion:
            return clean["input_ids"].shape[1]
        return int((clean["lengths"] - clean["prompt_lengths"]).max())

    # -- random part -------------------------------------------------------------------------------
    def draw_block_size(self, generator: torch.Generator | None = None) -> int:
        if self.block_size is not None:
            return self.block_size
        lo, hi = self.block_size_range
        return int(torch.randint(lo, hi + 1, (1,), generator=generator))

    def draw_noise(self, batch: int, length: int, generators=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(η (B,), uniforms (B, length)): one generator for the batch, or a list of one per sequence."""
        if generators is None or isinstance(generators, torch.Generator):
            eta = torch.rand(batch, generator=generators)
            u = torch.rand(batch, length, generator=generators)
        else:
            eta = torch.stack([torch.rand((), generator=g) for g in generators])
            u = torch.stack([torch.rand(length, generator=g) for g in generators])
        if self.mask_rate is not None:
            eta = torch.full_like(eta, float(self.mask_rate))
        return eta, u

    def corrupt(self, clean: dict, block_size: int, eta: torch.Tensor, u: torch.Tensor,
                dense_mask: bool = True) -> dict:
        """The doubled batch for block size k: position p of the noisy copy is masked iff u < η.

        Returns input_ids, position_ids (B,T), attention_mask (B,1,T,T) bool, labels (B,T) and
        num_clean = L, where T = L + M (M = L unless aligned to completions). dense_mask=False leaves
        attention_mask None (the caller builds a flex_attention BlockMask instead).
        """
        ids, lengths, prompt = clean["input_ids"], clean["lengths"], clean["prompt_lengths"]
        dev = ids.device
        lengths, prompt = lengths.to(dev), prompt.to(dev)
        b, n = ids.shape
        k = int(block_size)
        origin = prompt if self.align_to_completion else torch.zeros_like(prompt)
        n_noisy = lengths - origin
        m = self.noisy_length(clean)
        j = torch.arange(m, device=dev)
        src_pos = origin[:, None] + j[None]                                  # (B,M) position in x
        noisy_real = j[None] < n_noisy[:, None]
        src = ids.gather(1, src_pos.clamp(max=n - 1))
        masked = noisy_real & (u[:, :m].to(dev) < eta.to(dev)[:, None])
        noisy_ids = torch.where(masked, self.mask_token_id, torch.where(noisy_real, src, self.pad_token_id))
        clean_real = torch.arange(n, device=dev)[None] < lengths[:, None]

        t = n + m
        allowed = self._mask(n, m, k, origin, clean_real, noisy_real) if dense_mask else None

        labels = torch.full((b, t), IGNORE, dtype=torch.long, device=dev)
        nxt = torch.arange(1, n, device=dev)[None]
        ntp_ok = (nxt < lengths[:, None]) & (nxt >= prompt[:, None])
        labels[:, : n - 1] = torch.where(ntp_ok, ids[:, 1:], IGNORE)
        complete = j[None] < (n_noisy // k * k)[:, None]
        matp_ok = masked & complete & (src_pos >= prompt[:, None])
        labels[:, n:] = torch.where(matp_ok, src, IGNORE)

        position_ids = torch.cat([torch.arange(n, device=dev).expand(b, n), src_pos.clamp(max=n - 1)], 1)
        return {"input_ids": torch.cat([ids, noisy_ids], 1), "position_ids": position_ids,
                "attention_mask": None if allowed is None else allowed[:, None], "labels": labels, "num_clean": n}

    @staticmethod
    def _mask(n: int, m: int, k: int, origin, clean_real, noisy_real) -> torch.Tensor:
        """(B,T,T) bool, T = n + m: SPEC §2.4 with noisy blocks starting at `origin`, no attention
        to or from padding, and every padding row allowed to see itself (no empty softmax row)."""
        dev = clean_real.device
        t, b = n + m, clean_real.shape[0]
        start = torch.arange(m, device=dev).div(k, rounding_mode="floor") * k    # first position of q's block
        allowed = torch.empty(b, t, t, dtype=torch.bool, device=dev)
        allowed[:, :n, :n] = torch.ones(n, n, dtype=torch.bool, device=dev).tril()   # clean -> clean causal
        allowed[:, :n, n:] = False                                                # clean never sees noisy
        allowed[:, n:, n:] = start[:, None] == start[None]                        # noisy -> same noisy block
        # noisy -> clean strictly before the block (the only batch-dependent part): kv < origin + start
        allowed[:, n:, :n] = torch.arange(n, device=dev) < (origin[:, None] + start[None])[:, :, None]
        real = torch.cat([clean_real, noisy_real], 1)
        allowed &= real[:, :, None]
        allowed &= real[:, None, :]
        allowed.diagonal(dim1=1, dim2=2).fill_(True)
        return allowed

    def causal(self, clean: dict) -> dict:
        """The `--mode ntp` batch: the single clean copy, causal LM labels aligned with the logits."""
        ids, lengths, prompt = clean["input_ids"], clean["lengths"], clean["prompt_lengths"]
        dev = ids.device
        lengths, prompt = lengths.to(dev), prompt.to(dev)
        b, n = ids.shape
        labels = torch.full((b, n), IGNORE, dtype=torch.long, device=dev)
        nxt = torch.arange(1, n, device=dev)[None]
        ok = (nxt < lengths[:, None]) & (nxt >= prompt[:, None])
        labels[:, : n - 1] = torch.where(ok, ids[:, 1:], IGNORE)
        return {"input_ids": ids, "position_ids": torch.arange(n, device=dev).expand(b, n),
                "attention_mask": (torch.arange(n, device=dev)[None] < lengths[:, None]).long(),
                "labels": labels, "num_clean": n}

    def __call__(self, features: Sequence[dict]) -> dict:
        clean = self.pad(features)
        k = self.draw_block_size(self.generator)
        eta, u = self.draw_noise(len(features), self.noisy_length(clean), self.generator)
        out = self.corrupt(clean, k, eta, u)
        out.pop("num_clean")
        return out
