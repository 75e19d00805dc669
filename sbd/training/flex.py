"""The training mask as a flex_attention BlockMask, for CUDA (docs/method.md §2, without an O(T²) dense mask).

The dense bool mask costs B·T² bytes and makes SDPA use its slow masked kernel; flex_attention skips
whole tiles that the block structure rules out. The rule is the one `SBDDataCollator.corrupt` builds
densely (tests check the dense form on CPU); this file is only used when the model runs on CUDA with
attn_implementation="flex_attention".
"""

from __future__ import annotations

import torch


def training_block_mask(lengths: torch.Tensor, origins: torch.Tensor, noisy_lengths: torch.Tensor, num_clean: int,
                        num_noisy: int, block_size: int, device):
    """BlockMask over [clean (num_clean) | noisy (num_noisy)] for a right-padded batch.

    lengths: real clean length of each row; origins: where its noisy copy starts in x; noisy_lengths:
    real noisy length of each row (EOS padding included), as `SBDDataCollator.noisy_lengths` gives it."""
    from torch.nn.attention.flex_attention import create_block_mask

    n, k = num_clean, block_size
    lengths, origins, n_noisy = lengths.to(device), origins.to(device), noisy_lengths.to(device)

    def mask_mod(b, h, q, kv):
        q_noisy, kv_noisy = q >= n, kv >= n
        q_block = (q - n) // k
        real_q = torch.where(q_noisy, q - n < n_noisy[b], q < lengths[b])
        real_kv = torch.where(kv_noisy, kv - n < n_noisy[b], kv < lengths[b])
        clean_clean = ~q_noisy & ~kv_noisy & (kv <= q)
        noisy_noisy = q_noisy & kv_noisy & (q_block == (kv - n) // k)
        noisy_clean = q_noisy & ~kv_noisy & (kv < origins[b] + q_block * k)
        return ((clean_clean | noisy_noisy | noisy_clean) & real_q & real_kv) | (q == kv)

    t = num_clean + num_noisy
    return create_block_mask(mask_mod, B=lengths.shape[0], H=None, Q_LEN=t, KV_LEN=t, device=device)
