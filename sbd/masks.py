"""Attention masks of training and decoding (docs/method.md §2, §3), as plain bool tensors (True = may attend)."""

from __future__ import annotations

import torch


def inference_mask(
    pad: torch.Tensor, past_len: int, n_causal: int, n_block: int
) -> torch.Tensor:
    """Mask of one decoding forward: `n_causal` committed tokens then `n_block` block tokens.

    The cache holds `past_len` positions, of which the first `pad[b]` of row b are left padding.
    Causal queries see the real past and the earlier causal queries; block queries see the real past,
    every causal query and every block position (bidirectional). A padding query sees only itself so
    that no attention row is empty (an empty row would give NaN keys/values in the next layer).

    Returns (B, 1, n_causal + n_block, past_len + n_causal + n_block).
    """
    q_len = n_causal + n_block
    device = pad.device
    q = torch.arange(q_len, device=device)[:, None]
    kv = torch.arange(past_len + q_len, device=device)[None, :]
    local = (kv <= past_len + q) | (q >= n_causal)
    real = kv[None] >= pad[:, None, None]
    own = (kv == past_len + q)[None]
    return ((local[None] & real) | own)[:, None]


def causal_mask(pad: torch.Tensor, length: int) -> torch.Tensor:
    """Plain causal mask over `length` left-padded tokens (a prefill), (B, 1, length, length)."""
    return inference_mask(pad, 0, length, 0)


def training_mask(seq_len: int, block_size: int, device=None) -> torch.Tensor:
    """Hybrid mask over the doubled sequence [x | x̂] (docs/method.md §2), shape (2L, 2L).

    clean→clean causal; noisy→noisy within the same block of `block_size`; noisy→clean only for
    clean positions in strictly earlier blocks. Clean positions never see noisy ones.
    """
    if seq_len < 1 or block_size < 1:
        raise ValueError("training_mask needs seq_len >= 1 and block_size >= 1")
    n = seq_len
    idx = torch.arange(2 * n, device=device)
    q, kv = idx[:, None], idx[None, :]
    q_noisy, kv_noisy = q >= n, kv >= n
    q_block = (q - n) // block_size
    clean_clean = ~q_noisy & ~kv_noisy & (kv <= q)
    noisy_noisy = q_noisy & kv_noisy & (q_block == (kv - n) // block_size)
    noisy_clean = q_noisy & ~kv_noisy & (kv < q_block * block_size)
    return clean_clean | noisy_noisy | noisy_clean


def tree_mask(parents) -> torch.Tensor:
    """Mask of a tree of tokens fed in one forward (tree drafts of sbd-verify, docs/method.md), (N, N).

    `parents[i]` is node i's parent, an earlier node (parents[i] < i), or -1 for a node that hangs from
    the cached prefix directly (node 0 always does). Node i sees node j iff j is i or one of i's
    ancestors: each node attends to the one continuation it belongs to, as if that path alone had been
    fed causally, so its next-token logits and its key/value are those of a causal prefill of the path.
    """
    n = len(parents)
    paths: list[list[int]] = []  # node i's ancestors and itself, root first (parents come first)
    cells = bytearray(n * n)  # built as bytes, one tensor at the end: this runs for every tree forward
    for i, p in enumerate(parents):
        p = int(p)
        if not -1 <= p < i or (i == 0 and p != -1):
            raise ValueError(f"tree_mask: node {i} has parent {p}; a parent is an earlier node or -1")
        paths.append((paths[p] if p >= 0 else []) + [i])
        for j in paths[i]:
            cells[i * n + j] = 1
    if not n:
        return torch.zeros(0, 0, dtype=torch.bool)
    return torch.frombuffer(cells, dtype=torch.uint8).view(n, n).bool()
