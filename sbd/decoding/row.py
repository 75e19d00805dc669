"""What every decoding row shares (`sbd.decoding.rows` has the methods): the prompt, the tokens made so far,
EOS and stop strings, the budget, and the logit processors of the next-token head."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..errors import SBDError
from .processing import bias_vector, processed, read_logprobs

if TYPE_CHECKING:
    from .spec import DecodeSpec


class Row:
    """What every method shares: the prompt, the tokens made so far, EOS and stop strings, the budget, and
    the logit processors of the next-token head. `logprobs`: None, or one (token, logprob, [(alt,
    logprob), …]) per token of `out` when `processing.logprobs` asks for them."""

    needs_extra = 0  # cache positions needed beyond prompt + budget

    def __init__(self, spec: DecodeSpec, prompt: list[int], *, eos: Sequence[int] = (), tokenizer=None,
                 seed: int | None = None, device=None):
        self.prompt = list(prompt)
        self.max_new = spec.max_new_tokens
        self.eos = frozenset(int(e) for e in eos)
        self.stop = list(spec.stop)
        self.tokenizer = tokenizer
        self.temperature = float(spec.temperature)
        self.gen = None
        self.seed = None
        if self.temperature > 0:
            self.seed = seed if seed is not None else torch.seed()
            self.gen = torch.Generator(device=device or "cpu")
            self.gen.manual_seed(self.seed)
        self.out: list[int] = []  # generated tokens, final
        self.steps: list[int] = []  # the forward (1-based) that produced each token
        self.accepted: list[int] = []  # sbd-verify: draft tokens kept at each verifying forward
        self.proposed = 0  # sbd-verify: draft tokens put up for verification
        self.lookup_accepted = 0  # sbd-verify with lookup: kept draft tokens that prompt lookup proposed
        self.nfe = 0
        self.finished = False
        self.in_prefill = False
        self._checked = 0  # tokens already searched for stop strings
        # None when the processors change nothing: the hot path then skips them entirely
        processing = spec.processing
        self.processing = processing if processing.changes_logits else None
        self.top_logprobs = processing.logprobs
        self.logprobs: list | None = [] if self.top_logprobs is not None else None
        self._bias: torch.Tensor | None = None  # logit_bias as a dense vector, made at the first forward
        self._counts: torch.Tensor | None = None  # (V,) on the device: how often each token was generated
        self._uncounted: list[int] = []  # generated tokens not yet added to _counts

    def _next_token_logits(self, logits: torch.Tensor, draft: torch.Tensor | None = None,
                           ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """The next-token logits (m, V) after logit_bias and the penalties; `draft`: the tokens fed at
        positions 1 … m−1, counted for the positions after them (a tree: for their descendants only,
        `ancestors` (m, m) from `sbd.masks.tree_mask`)."""
        p = self.processing
        if p.logit_bias and self._bias is None:
            self._bias = bias_vector(p, logits.shape[-1], logits.device)
        if p.penalised:
            if self._counts is None:
                self._counts = torch.zeros(logits.shape[-1], dtype=torch.float32, device=logits.device)
            if self._uncounted:
                new = torch.tensor(self._uncounted, dtype=torch.long, device=logits.device)
                self._counts.index_add_(0, new, torch.ones(len(self._uncounted), device=logits.device))
                self._uncounted = []
        return processed(logits, p, self._bias, self._counts, draft, ancestors)

    def _logprob_width(self) -> int:
        return 0 if self.top_logprobs is None else 1 + 2 * self.top_logprobs

    def _take(self, tokens: list[int], lp_values: list[float] = ()) -> int:
        """Append tokens made in this forward (with their logprob values, if asked for); returns where
        they start in `out`."""
        start = len(self.out)
        self.out += tokens
        self.steps += [self.nfe] * len(tokens)
        if self.logprobs is not None:
            self.logprobs += read_logprobs(list(lp_values), tokens, self.top_logprobs)
        if self.processing is not None and self.processing.penalised:
            self._uncounted += tokens
        return start

    @property
    def needs(self) -> int:
        return len(self.prompt) + self.max_new + self.needs_extra

    def draw_on(self, device: torch.device) -> None:
        """Sampled rows draw on the device their logits are on: a row made without `device` (the CPU's
        generator) gets its seed's generator there when it joins an engine, before its first draw."""
        if self.gen is not None and self.gen.device.type != torch.device(device).type:
            if self.nfe:
                raise SBDError(f"this row has drawn on {self.gen.device.type} already; it cannot join an engine on "
                               f"{torch.device(device).type}")
            self.gen = torch.Generator(device=device)
            self.gen.manual_seed(self.seed)

    def final_tokens(self) -> list[int]:
        """Tokens that can no longer change (for streaming)."""
        return self.out

    def _end(self, start: int, candidates: list[int]) -> int | None:
        """Where the row ends, if it does: the first EOS among candidates (which begin at `start`), the
        shortest stop-string prefix, or the budget."""
        end = None
        for i, t in enumerate(candidates):
            if t in self.eos:
                end = start + i + 1
                break
        if self.stop and self.tokenizer is not None:  # opt-in: only then the text is looked at
            n = self._stop_length(self.out[:start] + candidates)
            if n is not None and (end is None or n < end):
                end = n
        if start + len(candidates) >= self.max_new:
            end = min(end if end is not None else self.max_new, self.max_new)
        return end

    def _stop_length(self, ids: list[int]) -> int | None:
        """Shortest n > checked such that the text of ids[:n] contains a stop string, if any."""
        if not self.stop or self.tokenizer is None:
            return None
        for n in range(self._checked + 1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:n], skip_special_tokens=True)
            if any(s in text for s in self.stop):
                return n
        self._checked = len(ids)
        return None

    def _finish(self, n: int) -> None:
        del self.out[n:], self.steps[n:]
        if self.logprobs is not None:
            del self.logprobs[n:]
        self.finished = True

    @property
    def finish_reason(self) -> str:
        """OpenAI's words: "stop" (EOS or a stop string) or "length" (the budget ran out)."""
        if self.out and self.out[-1] in self.eos:
            return "stop"
        if self.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(self.out, skip_special_tokens=True)
            if any(s in text for s in self.stop):
                return "stop"
        return "length" if len(self.out) >= self.max_new else "stop"

    def text(self) -> str:
        """The generated text, cut before the first stop string."""
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(self.out, skip_special_tokens=True)
        cut = [text.index(s) for s in self.stop if s in text]
        return text[: min(cut)] if cut else text
