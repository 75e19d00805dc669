"""Prompt lookup, the draft rule sbd-verify and the vLLM plug-in share: when the last 3 (else 2) tokens
of prompt + output occurred earlier, draft what followed their latest earlier occurrence, continued as a
repeat (a loop of 5 tokens drafts the loop again), so the draft is always `n` tokens long.

`draft` finds the occurrence by scanning (what a caller holding only the sequence does, once per step);
`VerifyRow` keeps an index over the sequence instead and builds the draft with `continuation`.
"""

from __future__ import annotations

from typing import Sequence

NGRAMS = (3, 2)  # match the last 3 tokens, else the last 2


def continuation(seq: Sequence[int], start: int, g: int, n: int) -> list[int]:
    """The n tokens that follow the g-gram at `start`: what followed it up to the end of `seq`, repeated."""
    period = len(seq) - start - g
    return [int(seq[start + g + i % period]) for i in range(n)]


def latest_occurrence(seq: list[int], g: int) -> int | None:
    """The latest start s < len(seq) - g at which seq[s:s+g] equals the last g tokens, or None."""
    n = len(seq)
    if n <= g:
        return None
    tail = seq[n - g:]
    for s in range(n - g - 1, -1, -1):
        if seq[s] == tail[0] and seq[s:s + g] == tail:
            return s
    return None


def draft(seq: Sequence[int], n: int, ngrams: Sequence[int] = NGRAMS) -> list[int]:
    """Prompt lookup's draft of `n` tokens for `seq` (prompt + output), or [] when nothing matches."""
    seq = seq if isinstance(seq, list) else [int(t) for t in seq]
    for g in ngrams:
        s = latest_occurrence(seq, g)
        if s is not None:
            return continuation(seq, s, g, n)
    return []
