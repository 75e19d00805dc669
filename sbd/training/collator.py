"""The SBD data collator (docs/method.md §2): doubled input [x | x̂], shared positions, 4-D bool mask, labels.

Collation is split in two so that a trainer can draw the randomness itself: `pad` is deterministic
(right padding, lengths, prompt lengths) and `corrupt` turns a padded batch into the model input for a
given block size and given uniforms. `__call__` does both with the collator's own generator, which is
what a Hugging Face user expects from a data collator.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..errors import SBDError

IGNORE = -100
BLOCK_SIZE_RANGE = (2, 16)
LAST_BLOCK_RULES = ("eos", "drop")


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


def _labelled_blocks(labelled: torch.Tensor, k: int, columns: list) -> list:
    """`columns` ((B,M) tensor, fill value) of the noisy half cut down to the blocks of k positions that hold
    a label (`labelled` (B,M)): each row's in order, block-aligned from position 0, the rest filled."""
    b, m = labelled.shape
    nb = -(-m // k)
    has = torch.nn.functional.pad(labelled, (0, nb * k - m)).view(b, nb, k).any(-1)   # (B, blocks)
    counts = has.sum(1)
    w = int(counts.max()) if b else 0
    order = torch.argsort((~has).to(torch.uint8), dim=1, stable=True)[:, :w]          # labelled blocks first
    jj = torch.arange(w * k, device=labelled.device)
    sel = order[:, jj // k] * k + jj % k                                                # (B, w·k) position in M
    keep = ((jj // k)[None] < counts[:, None]) & (sel < m)
    sel = sel.clamp(max=max(m - 1, 0))
    return [(torch.where(keep, x.gather(1, sel), fill), fill) for x, fill in columns]


class SBDDataCollator:
    """Turns `{"input_ids": [...], "prompt_length": P}` examples into an SBD training batch.

    block_size / mask_rate: fixed when given, else k ~ U{block_size_range} per call and η ~ U(0,1) per
    sequence. seed: seeds the collator's own generator (None: torch's global generator).
    align_to_completion: the noisy copy holds only the completion, with blocks starting where the
    completion starts (where decoding puts them); the mask stays exact. Off by default (paper layout).
    last_block: what happens to the block that holds the end of a sequence. "eos" (default): a sequence
    that ends with EOS is padded with EOS in the noisy copy up to the end of that block, with EOS as
    the masked target on the padding, so the block decoding will stop in is trained for every k
    (docs/method.md). "drop": the paper's rule, masked targets only inside complete blocks.
    suffix_share: share of noisy blocks masked as a suffix (the block's first c tokens visible, the
    rest masked, c uniform) instead of independently at rate η: the pattern left-to-right decoding sees.
    noisy_blocks: the noisy copy holds only this many blocks of each sequence, drawn at random without
    replacement (all of them when a sequence has fewer), each still attending to the clean prefix before
    its own place in x. A training step then costs in proportion to the blocks it trains rather than to
    the sequence length (with the clean half cut after the last block, `training/adapter_forward.py`).
    None (default): every block, the paper's layout.
    """

    def __init__(self, tokenizer=None, mask_token_id: int | None = None, block_size: int | None = None,
                 mask_rate: float | None = None, seed: int | None = None,
                 block_size_range: tuple[int, int] = BLOCK_SIZE_RANGE, align_to_completion: bool = False,
                 last_block: str = "eos", eos_token_id: int | None = None, suffix_share: float = 0.0,
                 noisy_blocks: int | None = None):
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
        if last_block not in LAST_BLOCK_RULES:
            raise SBDError(f"last_block must be one of {', '.join(LAST_BLOCK_RULES)}, got {last_block!r}")
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = getattr(tokenizer, "eos_token_id", None)
        if last_block == "eos" and eos_token_id is None:
            raise SBDError("last_block='eos' pads with the EOS token, but none is known: pass eos_token_id "
                           "or use last_block='drop'")
        if not 0.0 <= float(suffix_share) <= 1.0:
            raise SBDError(f"suffix_share must lie in [0, 1], got {suffix_share!r}")
        if noisy_blocks is not None and (not isinstance(noisy_blocks, int) or isinstance(noisy_blocks, bool)
                                         or noisy_blocks < 1):
            raise SBDError(f"noisy_blocks must be an integer >= 1, got {noisy_blocks!r}")
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        if pad is None and tokenizer is not None:
            pad = getattr(tokenizer, "eos_token_id", None)
        self.mask_token_id = int(mask_token_id)
        self.pad_token_id = int(pad) if pad is not None else 0
        self.block_size, self.mask_rate = block_size, mask_rate
        self.block_size_range = (lo, hi)
        self.align_to_completion = align_to_completion
        self.last_block = last_block
        self.eos_token_id = int(eos_token_id) if eos_token_id is not None else None
        self.suffix_share = float(suffix_share)
        self.noisy_blocks = noisy_blocks
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

    def _origins(self, clean: dict) -> torch.Tensor:
        """Where each row's noisy copy (and its first block) starts in x: 0, or the completion start."""
        return clean["prompt_lengths"] if self.align_to_completion else torch.zeros_like(clean["prompt_lengths"])

    def noisy_lengths(self, clean: dict, block_size: int) -> torch.Tensor:
        """(B,) real length of each row's noisy copy for block size k: the tokens from its origin on, plus
        the EOS padding that completes the block holding a final EOS (last_block="eos")."""
        lengths, ids = clean["lengths"], clean["input_ids"]
        span = lengths - self._origins(clean).to(lengths.device)
        if self.last_block != "eos":
            return span
        k = int(block_size)
        last = ids.gather(1, (lengths.to(ids.device) - 1)[:, None])[:, 0].to(lengths.device)
        ends = last == self.eos_token_id
        return torch.where(ends, (span + k - 1) // k * k, span)

    def _sizes(self):
        """Every block size a step may draw."""
        lo, hi = self.block_size_range
        return [self.block_size] if self.block_size is not None else range(lo, hi + 1)

    def noisy_length(self, clean: dict, block_size: int | None = None) -> int:
        """Length M of the noisy copy for block size k; without k, the largest M any k drawn can give
        (the number of uniforms to draw per sequence). With `noisy_blocks`, at most that many blocks."""
        if block_size is None:
            return max(self.noisy_length(clean, k) for k in self._sizes())
        full = int(self.noisy_lengths(clean, block_size).max())
        if self.noisy_blocks is None:
            return full
        k = int(block_size)
        return min(full, self.noisy_blocks * k)

    def block_count(self, clean: dict, block_size: int | None = None) -> int:
        """The most blocks a row's full noisy copy holds for block size k (any k drawn, without k): the
        number of uniforms `draw_windows` draws per sequence."""
        if block_size is None:
            return max(self.block_count(clean, k) for k in self._sizes())
        k = int(block_size)
        return int((-(-self.noisy_lengths(clean, k) // k)).max())

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

    def draw_block_noise(self, batch: int, length: int, generators=None) -> torch.Tensor | None:
        """(B, length, 2) uniforms for the suffix-masked blocks (whether, where the cut is), read at each
        block's first position; None when suffix_share is 0 (nothing is drawn then)."""
        if self.suffix_share <= 0:
            return None
        if generators is None or isinstance(generators, torch.Generator):
            return torch.rand(batch, length, 2, generator=generators)
        return torch.stack([torch.rand(length, 2, generator=g) for g in generators])

    def draw_windows(self, batch: int, blocks: int, generators=None) -> torch.Tensor | None:
        """(B, blocks) uniforms that pick each row's noisy blocks (the `noisy_blocks` smallest among its
        blocks); None when noisy_blocks is None (nothing is drawn then)."""
        if self.noisy_blocks is None:
            return None
        if generators is None or isinstance(generators, torch.Generator):
            return torch.rand(batch, blocks, generator=generators)
        return torch.stack([torch.rand(blocks, generator=g) for g in generators])

    def layout(self, clean: dict, block_size: int, windows: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where the noisy copy comes from, for block size k: (offset (B,M): position after the row's
        origin in x that noisy position j copies, real (B,M): j holds a token of the row (not padding),
        full (B,): the row's whole noisy length). Without `noisy_blocks` the offset of j is j; with it,
        the j-th noisy block is the row's chosen block (`windows`, from `draw_windows`)."""
        k = int(block_size)
        full = self.noisy_lengths(clean, k).to(clean["input_ids"].device)
        dev = full.device
        m = self.noisy_length(clean, k)
        j = torch.arange(m, device=dev)
        if self.noisy_blocks is None:
            return j[None].expand(len(full), m), j[None] < full[:, None], full
        if windows is None:
            raise ValueError("noisy_blocks needs the window uniforms (draw_windows)")
        blocks = -(-full // k)                                              # (B,) blocks in each full copy
        nb = int(blocks.max())
        if windows.shape[1] < nb:
            raise ValueError(f"need {nb} window uniforms per sequence for block size {k}, got {windows.shape[1]}")
        score = windows[:, :nb].to(dev).masked_fill(torch.arange(nb, device=dev)[None] >= blocks[:, None], 2.0)
        w = min(self.noisy_blocks, nb)
        chosen = score.argsort(dim=1, stable=True)[:, :w].sort(dim=1).values  # (B, w) in order of x
        slot = j // k
        offset = chosen.gather(1, slot[None].expand(len(full), m)) * k + (j % k)[None]
        real = (slot[None] < blocks.clamp(max=w)[:, None]) & (offset < full[:, None])
        return offset, real, full

    def sources(self, clean: dict, block_size: int, windows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, M): the position in x that each noisy position copies; −1 for EOS padding and padding."""
        offset, real, _ = self.layout(clean, block_size, windows)
        origin = self._origins(clean).to(offset.device)
        from_x = real & (offset < (clean["lengths"].to(offset.device) - origin)[:, None])
        return torch.where(from_x, origin[:, None] + offset, -1)

    def previous_tokens(self, clean: dict, block_size: int, windows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, M): for each noisy position, the true token at the position before it in the same block
        (the token a sampler head is fed in teacher forcing), −1 at a block's first position. The true
        token of EOS padding is EOS."""
        src = self.sources(clean, block_size, windows)
        ids = clean["input_ids"].to(src.device)
        fill = self.eos_token_id if self.eos_token_id is not None else self.pad_token_id
        truth = torch.where(src >= 0, ids.gather(1, src.clamp_min(0)), fill)
        prev = torch.full_like(truth, -1)
        j = torch.arange(truth.shape[1], device=truth.device)
        inside = (j % int(block_size) != 0)[1:]
        prev[:, 1:] = torch.where(inside[None], truth[:, :-1], -1)
        return prev

    def corrupt(self, clean: dict, block_size: int, eta: torch.Tensor, u: torch.Tensor,
                dense_mask: bool = True, block_noise: torch.Tensor | None = None,
                windows: torch.Tensor | None = None, drop_unlabelled: bool = False,
                length_to: Callable[[int], int] | None = None) -> dict:
        """The doubled batch for block size k: position p of the noisy copy is masked iff u < η (or, in a
        suffix-masked block, iff p lies at or after the block's cut).

        u: (B, ≥M) uniforms; block_noise: `draw_block_noise`'s draw (needed when suffix_share > 0);
        windows: `draw_windows`'s draw (needed when noisy_blocks is set).
        Returns input_ids, position_ids (B,T), attention_mask (B,1,T,T) bool, labels (B,T) and
        num_clean = L, where T = L + M. dense_mask=False leaves attention_mask None (the caller builds a
        flex_attention BlockMask instead) and adds "noisy_layout": (block start in x (B,M) long, real
        (B,M) bool) of every noisy position, what `flex.training_block_mask` needs.

        Two ways to compute less for the same loss and gradients, the draws unchanged:
        drop_unlabelled: leave out the noisy blocks that hold no label (none of their tokens is a masked
        completion token: a low η, a block inside the prompt, the incomplete last block). Nothing outside a
        noisy block attends to it, so no labelled position's logits change; each row keeps its labelled
        blocks in order, block-aligned, with their positions and their view of the clean prefix, and the
        noisy half is as wide as the row that keeps the most. length_to: the whole length T is padded at
        the end of the noisy half to length_to(T) (`flex.bucket_length`: lengths repeat, so compiled
        kernels are reused); padding has no label, attends to itself only and is seen by nothing.
        """
        ids, lengths, prompt = clean["input_ids"], clean["lengths"], clean["prompt_lengths"]
        dev = ids.device
        lengths, prompt = lengths.to(dev), prompt.to(dev)
        b, n = ids.shape
        k = int(block_size)
        origin = self._origins(clean).to(dev)
        n_src = lengths - origin                                             # tokens of x in the noisy copy
        offset, noisy_real, n_noisy = self.layout(clean, k, windows)        # n_noisy: plus the EOS padding
        m = offset.shape[1]
        if u.shape[1] < m:
            raise ValueError(f"need {m} uniforms per sequence for block size {k}, got {u.shape[1]}")
        if self.noisy_blocks is not None and not dense_mask:
            raise SBDError("noisy_blocks needs the dense training mask (SDPA); flex_attention does not support it")
        j = torch.arange(m, device=dev)
        src_pos = origin[:, None] + offset                                   # (B,M) position in x
        from_x = offset < n_src[:, None]
        src = torch.where(from_x, ids.gather(1, src_pos.clamp(max=n - 1)),
                          self.eos_token_id if self.eos_token_id is not None else self.pad_token_id)
        masked = u[:, :m].to(dev) < eta.to(dev)[:, None]
        if self.suffix_share > 0:
            if block_noise is None:
                raise ValueError("suffix_share > 0 needs block_noise (draw_block_noise)")
            start = j - j % k                                                # first position of each block
            first = block_noise[:, :m].to(dev).gather(1, start[None, :, None].expand(b, m, 2))
            suffix = first[..., 0] < self.suffix_share
            cut = (first[..., 1] * k).floor()
            masked = torch.where(suffix, (j % k)[None] >= cut, masked)
        masked &= noisy_real
        noisy_ids = torch.where(masked, self.mask_token_id, torch.where(noisy_real, src, self.pad_token_id))
        clean_real = torch.arange(n, device=dev)[None] < lengths[:, None]
        block_x = origin[:, None] + offset - offset % k                     # (B,M) where each block starts in x
        complete = offset < (n_noisy // k * k)[:, None]                     # padded rows are complete
        matp_ok = masked & complete & (src_pos >= prompt[:, None])
        noisy_labels = torch.where(matp_ok, src, IGNORE)
        # every position id stays within the row's real span (padding rows are masked out anyway)
        noisy_pos = torch.minimum(src_pos, (origin + n_noisy - 1).clamp_min(0)[:, None])

        columns = [(noisy_ids, self.pad_token_id), (noisy_labels, IGNORE), (noisy_pos, 0), (block_x, 0),
                   (noisy_real, False)]
        if drop_unlabelled:
            columns = _labelled_blocks(matp_ok, k, columns)
        if length_to is not None:
            extra = int(length_to(n + columns[0][0].shape[1])) - n - columns[0][0].shape[1]
            if extra > 0:
                columns = [(torch.cat([x, x.new_full((b, extra), fill)], 1), fill) for x, fill in columns]
        (noisy_ids, noisy_labels, noisy_pos, block_x, noisy_real) = (x for x, _ in columns)
        m = noisy_ids.shape[1]

        t = n + m
        allowed = self._mask(n, m, k, block_x, clean_real, noisy_real) if dense_mask else None
        labels = torch.full((b, t), IGNORE, dtype=torch.long, device=dev)
        nxt = torch.arange(1, n, device=dev)[None]
        ntp_ok = (nxt < lengths[:, None]) & (nxt >= prompt[:, None])
        labels[:, : n - 1] = torch.where(ntp_ok, ids[:, 1:], IGNORE)
        labels[:, n:] = noisy_labels
        position_ids = torch.cat([torch.arange(n, device=dev).expand(b, n), noisy_pos], 1)
        out = {"input_ids": torch.cat([ids, noisy_ids], 1), "position_ids": position_ids,
               "attention_mask": None if allowed is None else allowed[:, None], "labels": labels, "num_clean": n}
        if not dense_mask:
            out["noisy_layout"] = (block_x, noisy_real)
        return out

    @staticmethod
    def _mask(n: int, m: int, k: int, block_x, clean_real, noisy_real) -> torch.Tensor:
        """(B,T,T) bool, T = n + m: the training mask (docs/method.md §2), where noisy position j's block
        starts at `block_x[b, j]` in x, no attention to or from padding, and every padding row allowed to
        see itself (no empty softmax row)."""
        dev = clean_real.device
        t, b = n + m, clean_real.shape[0]
        start = torch.arange(m, device=dev).div(k, rounding_mode="floor") * k    # first position of q's block
        allowed = torch.empty(b, t, t, dtype=torch.bool, device=dev)
        allowed[:, :n, :n] = torch.ones(n, n, dtype=torch.bool, device=dev).tril()   # clean -> clean causal
        allowed[:, :n, n:] = False                                                # clean never sees noisy
        allowed[:, n:, n:] = start[:, None] == start[None]                        # noisy -> same noisy block
        # noisy -> clean strictly before the block's place in x (the only batch-dependent part)
        allowed[:, n:, :n] = torch.arange(n, device=dev) < block_x[:, :, None]
        real = torch.cat([clean_real, noisy_real], 1)
        allowed &= real[:, :, None]
        allowed &= real[:, None, :]
        allowed.diagonal(dim1=1, dim2=2).fill_(True)
        return allowed

    def causal(self, clean: dict, width: int | None = None) -> dict:
        """The `--mode ntp` batch: the single clean copy, causal LM labels aligned with the logits.
        width: pad it to this many positions (>= L; padding has no label and is masked out)."""
        ids, lengths, prompt = clean["input_ids"], clean["lengths"], clean["prompt_lengths"]
        dev = ids.device
        lengths, prompt = lengths.to(dev), prompt.to(dev)
        if width is not None and width > ids.shape[1]:
            ids = torch.cat([ids, ids.new_full((ids.shape[0], width - ids.shape[1]), self.pad_token_id)], 1)
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
        m = self.noisy_length(clean, k)
        eta, u = self.draw_noise(len(features), m, self.generator)
        windows = self.draw_windows(len(features), self.block_count(clean, k), self.generator)
        out = self.corrupt(clean, k, eta, u, block_noise=self.draw_block_noise(len(features), m, self.generator),
                           windows=windows)
        out.pop("num_clean")
        return out
