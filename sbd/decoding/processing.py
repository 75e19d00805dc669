"""OpenAI's logit processors and logprobs for the next-token head (docs/method.md §3).

`Processing` holds a request's settings. The functions below apply them to a (m, V) block of next-token
logits at m consecutive causal positions, on the device: `processed` adds `logit_bias` and subtracts the
presence and frequency penalties (counts over the generated tokens only, never the prompt), `pick`
chooses a token (argmax, or a sample at a temperature from the top-p nucleus), `target_probs` is the
distribution a sample is drawn from, and `token_logprobs` reads logprobs off the raw logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..errors import SBDError

MAX_LOGPROBS = 20


def _number(name: str, value, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not lo <= value <= hi:
        raise SBDError(f"{name} must be a number from {lo:g} to {hi:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Processing:
    """How the next-token head's logits are changed before a token is chosen, and what logprobs to return.

    logit_bias: token id -> a number from -100 to 100 added to its logit (-100 bans it, 100 all but forces it).
    presence_penalty (-2..2): subtracted once from the logit of every token already generated.
    frequency_penalty (-2..2): subtracted once per time the token was already generated.
    top_p (0..1]: sample only from the most likely tokens whose probabilities add up to top_p (with a
    temperature > 0; greedy decoding ignores it).
    logprobs: None, or k from 0 to 20: return every generated token's logprob and the k most likely
    tokens with theirs, from the model's own distribution (temperature 1, before bias, penalties and top_p).
    Token ids are checked against the vocabulary by `validate(vocab_size)`.
    """

    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_p: float = 1.0
    logprobs: int | None = None

    def __post_init__(self):
        bias = {} if self.logit_bias is None else self.logit_bias
        if not isinstance(bias, dict):
            raise SBDError(f"logit_bias must map token ids to numbers, got {type(bias).__name__}")
        clean = {}
        for key, value in bias.items():
            tok = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else key
            if isinstance(tok, bool) or not isinstance(tok, int):
                raise SBDError(f"logit_bias keys must be token ids (integers), got {key!r}")
            clean[tok] = _number(f"logit_bias[{tok}]", value, -100, 100)
        object.__setattr__(self, "logit_bias", clean)
        object.__setattr__(self, "presence_penalty", _number("presence_penalty", self.presence_penalty, -2, 2))
        object.__setattr__(self, "frequency_penalty", _number("frequency_penalty", self.frequency_penalty, -2, 2))
        top_p = self.top_p
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or math.isnan(top_p) or not 0 < top_p <= 1:
            raise SBDError(f"top_p must be a number above 0 and at most 1, got {top_p!r}")
        object.__setattr__(self, "top_p", float(top_p))
        k = self.logprobs
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOGPROBS):
            raise SBDError(f"logprobs must be None or an integer from 0 to {MAX_LOGPROBS}, got {k!r}")

    def validate(self, vocab_size: int) -> "Processing":
        """Every logit_bias id lies in the vocabulary, or SBDError. Returns self."""
        bad = [t for t in self.logit_bias if not 0 <= t < vocab_size]
        if bad:
            raise SBDError(f"logit_bias token id {bad[0]} lies outside the model's vocabulary of {vocab_size}")
        return self

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def changes_logits(self) -> bool:
        """Whether the tokens can differ from plain decoding (False: skip the processors entirely)."""
        return bool(self.logit_bias) or self.penalised or self.top_p < 1

    @property
    def is_default(self) -> bool:
        return not self.changes_logits and self.logprobs is None


def bias_vector(processing: Processing, vocab: int, device) -> torch.Tensor | None:
    """logit_bias as a dense fp32 (V,) tensor on `device`, None without a bias."""
    if not processing.logit_bias:
        return None
    ids = torch.tensor(list(processing.logit_bias), dtype=torch.long)
    vals = torch.tensor(list(processing.logit_bias.values()), dtype=torch.float32)
    return torch.zeros(vocab).index_put_((ids,), vals).to(device)


def processed(logits: torch.Tensor, processing: Processing, bias: torch.Tensor | None = None,
              counts: torch.Tensor | None = None, draft: torch.Tensor | None = None,
              ancestors: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logits after logit_bias, then the penalties (OpenAI's rule):
    logits[t] += bias[t];  logits[t] -= presence_penalty · (count[t] > 0) + frequency_penalty · count[t].

    logits (m, V) at m consecutive causal positions; counts (V,) how often each token was generated
    before the first position; draft (m − 1,) the tokens fed at positions 1 … m−1, counted for the
    positions after them (as if decoded one by one). ancestors (m, m) bool: the positions form a tree
    (`sbd.masks.tree_mask`) and position i counts the draft tokens of its own ancestors and itself only."""
    out = logits.float()
    if bias is not None:
        out = out + bias
    if processing.penalised and counts is not None:
        c = counts.expand(out.shape[0], -1)
        if draft is not None and draft.numel():
            seen = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
            seen[1:].scatter_(-1, draft[:, None], 1.0)
            c = c + (seen.cumsum(0) if ancestors is None else ancestors.float() @ seen)
        out = out - processing.presence_penalty * (c > 0).float() - processing.frequency_penalty * c
    return out


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs (…, V) kept on the smallest set of most likely tokens whose mass reaches top_p (always the
    most likely one), renormalised."""
    if top_p >= 1:
        return probs
    sorted_p, order = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass of the tokens ranked above
    keep_sorted = before < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


def target_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The distribution a sample is drawn from: softmax(logits / temperature), cut to the top_p nucleus."""
    return nucleus(torch.softmax(logits.float() / temperature, dim=-1), top_p)


def pick(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
         generator: torch.Generator | None = None) -> torch.Tensor:
    """Argmax at temperature 0, otherwise a seeded sample of `target_probs` (same random stream as
    `sbd.sampler.pick_tokens`)."""
    if temperature <= 0:
        return logits.argmax(-1)
    noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    noise.exponential_(generator=generator)
    return (target_probs(logits, temperature, top_p) / noise).argmax(-1)


def token_logprobs(raw: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """(m, 1 + 2k) fp64: per position the logprob of `tokens` (m,), the k most likely ids, their logprobs.
    From the raw logits (m, V) at temperature 1."""
    lp = torch.log_softmax(raw.float(), dim=-1)
    parts = [lp.gather(-1, tokens[:, None].long())]
    if k:
        top = lp.topk(k, dim=-1)
        parts += [top.indices, top.values]
    return torch.cat([p.double() for p in parts], dim=-1)


def read_logprobs(values: list[float], tokens: list[int], k: int) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """Host values of `token_logprobs` back to (token, logprob, [(alt, logprob), …]) per position, for
    the given returned tokens (a prefix of the positions)."""
    w = 1 + 2 * k
    out = []
    for i, t in enumerate(tokens):
        v = values[i * w : (i + 1) * w]
        alts = [(int(a), float(b)) for a, b in zip(v[1 : 1 + k], v[1 + k :])]
        out.append((int(t), float(v[0]), alts))
    return out
