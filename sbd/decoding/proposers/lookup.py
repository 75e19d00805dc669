"""Prompt lookup, the draft rule sbd-verify and the vLLM plug-in share: when the last 3 (else 2) tokens
of prompt + output occurred earlier, draft what followed their latest earlier occurrence, continued as a
repeat (a loop of 5 tokens drafts the loop again), so the draft is always `n` tokens long.

`draft` finds the occurrence by scanning (what a caller holding only the sequence does, once per step:
the vLLM proposer); `LookupIndex` keeps an index over the sequence instead (a row that sees its output
grow: `VerifyRow`, and a vLLM request), reading each token once. Both draft the same tokens.
"""

from __future__ import annotations

from typing import Sequence

from .base import Seen

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


class LookupIndex:
    """Prompt lookup over one growing sequence (prompt + output) from an index (a `Drafter`): per n-gram
    size g, the g tokens → the latest start of an occurrence other than the sequence's own last g tokens.
    Only tokens committed since the last `find` are indexed: O(new tokens) per forward, not O(length)."""

    source = "lookup"
    width = 0  # it reads no value of the forward: the committed tokens

    def __init__(self, prompt: Sequence[int], ngrams: Sequence[int] = NGRAMS):
        self.prompt_length = len(prompt)
        self.seq = list(prompt)  # prompt + output as far as known
        self.indexed = 0  # the length of seq when the index was last brought up to date
        self.index: dict[int, dict[tuple[int, ...], int]] = {g: {} for g in ngrams}

    def _catch_up(self, out: Sequence[int]) -> list[int]:
        """seq extended by the output tokens not seen yet; every g-gram that starts before the last one
        (the sequence's own tail is no match) mapped to its latest start."""
        seq, before = self.seq, self.indexed
        seq += out[len(seq) - self.prompt_length :]
        for g, index in self.index.items():
            # starts 0 … len − g − 1 are indexed; those up to before − g − 1 were already
            for s in range(max(0, before - g), len(seq) - g):
                index[tuple(seq[s : s + g])] = s  # a later start overwrites: the latest occurrence
        self.indexed = len(seq)
        return seq

    def values(self, seen: Seen) -> list:
        return []

    def propose(self, values: Sequence[float], seen: Seen) -> list[int]:
        """`find` for the tokens committed so far (`seen.out`), at most `seen.longest` of them."""
        return self.find(seen.out, seen.longest)

    def find(self, out: Sequence[int], n: int) -> list[int]:
        """The n tokens that followed the latest earlier occurrence of the last 3 (else 2) tokens of
        prompt + `out` (the output so far: only its new tokens are read), or [] when there is none."""
        seq = self._catch_up(out)
        for g, index in self.index.items():
            if len(seq) <= g:
                continue
            s = index.get(tuple(seq[-g:]))
            if s is not None:
                return continuation(seq, s, g, n)
        return []
