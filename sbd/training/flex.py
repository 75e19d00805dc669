"""The training mask as a flex_attention BlockMask, for CUDA (docs/method.md §2, without an O(T²) dense mask).

The dense bool mask costs B·T² bytes and makes SDPA use its slow masked kernel; flex_attention skips
whole tiles that the block structure rules out. The rule is the one `SBDDataCollator.corrupt` builds
densely (tests check the dense form on CPU); this file is only used when the model runs on CUDA with
attn_implementation="flex_attention".

flex_attention runs compiled (transformers wraps it in `torch.compile`), and a compiled kernel is reused
only while its guards hold: the query length, and every Python number the mask_mod closes over. So the
mask_mod reads the clean length and the block size from tensors (a new k or L is new data, not a new
kernel), and the trainer pads every batch to a length of `bucket_length` (padding is masked out and
carries no label: the loss is unchanged), so that a run meets a handful of shapes instead of a new one
at almost every step (k ~ U{2..16} and the longest sequence of the batch change the length each step).
"""

from __future__ import annotations

import torch

SMALLEST = 16
TILE = 128  # flex_attention's default block (tile) size


def bucket_length(t: int) -> int:
    """The length a flex_attention batch of `t` positions is padded to: the next power of two from 16 up
    to 128, then the next multiple of 128 (flex_attention's tile). At most 2x the positions below 128 and
    less than one tile more above; a training run with sequences up to max_len meets at most
    4 + (2·max_len + 16) / 128 lengths, most runs far fewer."""
    t = int(t)
    if t <= TILE:
        return max(SMALLEST, 1 << max(t - 1, 1).bit_length())
    return -(-t // TILE) * TILE


def training_block_mask(lengths: torch.Tensor, origins: torch.Tensor, noisy_lengths: torch.Tensor, num_clean: int,
                        num_noisy: int, block_size: int, device, layout: tuple | None = None):
    """BlockMask over [clean (num_clean) | noisy (num_noisy)] for a right-padded batch.

    lengths: real clean length of each row; origins: where its noisy copy starts in x; noisy_lengths:
    real noisy length of each row (EOS padding included), as `SBDDataCollator.noisy_lengths` gives it.
    layout: (block start in x, real) (B, ≤num_noisy) of each noisy position, as `SBDDataCollator.corrupt`
    returns it under "noisy_layout" (needed when it left out blocks; origins and noisy_lengths are then
    not used). Noisy positions past the layout, or past a row's noisy length, are padding: they see only
    themselves and nothing sees them.

    The mask_mod reads tensors only (one host-to-device copy, not waited for): a compiled flex_attention
    kernel depends neither on num_clean nor on block_size."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, n, k, m = lengths.shape[0], int(num_clean), int(block_size), int(num_noisy)
    if layout is None:
        j = torch.arange(m)
        starts = origins.reshape(-1, 1).to(torch.long).cpu() + (j - j % k)[None]
        real = j[None] < noisy_lengths.reshape(-1, 1).cpu()
    else:
        starts, real = (x.cpu() for x in layout)
    # as wide as the whole (bucketed) length, not the noisy half: the tensors the mask_mod reads then have
    # the same shape for every batch of a bucket (their shapes are guarded like the query's); n >= 1 column
    width = n + m
    starts = torch.nn.functional.pad(starts.to(torch.long), (0, width - starts.shape[1]))
    real = torch.nn.functional.pad(real.to(torch.long), (0, width - real.shape[1]))
    meta = torch.cat([lengths.reshape(-1).to(torch.long).cpu(), torch.tensor([n, k]), starts.flatten(),
                      real.flatten()])
    if torch.device(device).type == "cuda":
        meta = meta.pin_memory().to(device, non_blocking=True)
    else:
        meta = meta.to(device)
    lengths, nk = meta[:b], meta[b:b + 2]
    starts = meta[b + 2:b + 2 + b * width].view(b, width)
    real = meta[b + 2 + b * width:].view(b, width) > 0
    n_t, k_t = nk[0], nk[1]

    def mask_mod(b, h, q, kv):
        q_noisy, kv_noisy = q >= n_t, kv >= n_t
        jq, jkv = (q - n_t).clamp(min=0), (kv - n_t).clamp(min=0)
        real_q = torch.where(q_noisy, real[b, jq], q < lengths[b])
        real_kv = torch.where(kv_noisy, real[b, jkv], kv < lengths[b])
        clean_clean = ~q_noisy & ~kv_noisy & (kv <= q)
        noisy_noisy = q_noisy & kv_noisy & (jq // k_t == jkv // k_t)
        noisy_clean = q_noisy & ~kv_noisy & (kv < starts[b, jq])
        return ((clean_clean | noisy_noisy | noisy_clean) & real_q & real_kv) | (q == kv)

    t = n + m
    return create_block_mask(mask_mod, B=b, H=None, Q_LEN=t, KV_LEN=t, device=device)
