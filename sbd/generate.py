"""NTP and SBD decoding over one exact KV cache (docs/method.md §3).

`generate` validates, encodes and dispatches; `ntp_decode` and `sbd_decode` are the two loops. Both
go through `Rows.forward`, the only place that calls the model: it builds positions and the 4-D mask,
appends the forward's committed tokens to the cache and drops its scratch (block) entries.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .cache import crop, select_rows, slab_cache
from .errors import SBDError
from .masks import inference_mask
from .sampler import PROXIES, error_proxy, pick_tokens, reveal_from_proxy

METHODS = ("ntp", "sbd")


@dataclass
class GenerationResult:
    """What a `generate` call produced, row by row, and what it cost.

    token_ids: generated tokens up to and including the first EOS (or the stop string's last token).
    nfe: model forwards per row, prefill excluded. steps: for every generated token, the forward
    (1-based, per row) that revealed it. seconds: wall time of the whole call after tokenisation,
    prefill included.
    """

    texts: list[str]
    token_ids: list[list[int]]
    nfe: list[int]
    steps: list[list[int]]
    seconds: float
    method: str
    prompt_lengths: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    @property
    def tokens_per_forward(self) -> float:
        total = sum(self.nfe)
        return self.num_tokens / total if total else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class ForwardRecord:
    """One model call as the decoding loop made it, for tests and tracing (see `observer`)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    logits: torch.Tensor
    n_commit: int
    cache: object
    rows: torch.Tensor


class Rows:
    """The rows still being decoded: their cache, left padding and original indices."""

    def __init__(self, model, pad: torch.Tensor, capacity: int, observer=None):
        self.model = model
        self.pad = pad
        self.rows = torch.arange(pad.shape[0], device=pad.device)
        self.cache = slab_cache(model, capacity)
        self.length = 0
        self.observer = observer
        self.keep_kw = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._key = None

    def forward(self, tokens: torch.Tensor, n_commit: int, n_logits: int) -> torch.Tensor:
        """Feed `tokens` (B, q): the first `n_commit` causally (kept in the cache), the rest as one
        bidirectional block (scratch, dropped after the call). Returns the last `n_logits` logits."""
        q = tokens.shape[1]
        key = (self.length, n_commit, q)
        if key != self._key:  # the forwards inside a block share positions and mask: build them once
            pos = (self.length + torch.arange(q, device=tokens.device))[None] - self.pad[:, None]
            self._pos, self._mask = pos.clamp_min(0), inference_mask(self.pad, self.length, n_commit, q - n_commit)
            self._key = key
        pos, mask = self._pos, self._mask
        kw = {"logits_to_keep": n_logits} if self.keep_kw else {}
        out = self.model(
            input_ids=tokens,
            position_ids=pos,
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
            **kw,
        )
        logits = out.logits[:, -n_logits:]
        crop(self.cache, q - n_commit)
        self.length += n_commit
        if self.observer is not None:
            self.observer(ForwardRecord(tokens, pos, mask, logits, n_commit, self.cache, self.rows))
        return logits

    def keep(self, live: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """Drop finished rows from the cache and from every per-row tensor given."""
        idx = live.nonzero().squeeze(1)
        select_rows(self.cache, idx)
        self.pad, self.rows, self._key = self.pad[idx], self.rows[idx], None
        return [t[idx] for t in tensors]


class Outputs:
    """Finished rows, filled in as each row stops."""

    def __init__(self, n: int, tokenizer, stop: Sequence[str]):
        self.ids: list[list[int] | None] = [None] * n
        self.steps: list[list[int] | None] = [None] * n
        self.nfe = [0] * n
        self.tokenizer = tokenizer
        self.stop = list(stop)

    def finish(self, row: int, ids: list[int], steps: list[int], nfe: int) -> None:
        self.ids[row], self.steps[row], self.nfe[row] = ids, steps, nfe

    def stop_length(self, ids: list[int], checked: int) -> int | None:
        """Shortest n > checked such that the text of ids[:n] contains a stop string, if any."""
        if not self.stop or self.tokenizer is None:
            return None
        for n in range(checked + 1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:n], skip_special_tokens=True)
            if any(s in text for s in self.stop):
                return n
        return None

    def texts(self) -> list[str]:
        if self.tokenizer is None:
            return [""] * len(self.ids)
        texts = []
        for ids in self.ids:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            cut = [text.index(s) for s in self.stop if s in text]
            texts.append(text[: min(cut)] if cut else text)
        return texts


def _check_finite(values: torch.Tensor) -> None:
    if not math.isfinite(values.sum()):  # NaN and ±inf both survive a sum
        raise SBDError("the model returned NaN or infinite logits; decoding stopped (check the weights and dtype)")


def ntp_decode(rows: Rows, ids: torch.Tensor, out: Outputs, eos: torch.Tensor, max_new: int,
               temperature: float, gen) -> None:
    """Plain next-token decoding: prefill all but the last prompt token, then one token per forward."""
    if ids.shape[1] > 1:
        rows.forward(ids[:, :-1], n_commit=ids.shape[1] - 1, n_logits=1)
    last = ids[:, -1:]
    made = torch.empty((ids.shape[0], max_new), dtype=torch.long, device=ids.device)
    checked = [0] * ids.shape[0]  # tokens already searched for stop strings, by original row
    for t in range(max_new):
        logits = rows.forward(last, n_commit=1, n_logits=1)[:, -1]
        _check_finite(logits.amax(-1))
        tok = pick_tokens(logits, temperature, gen)
        made[:, t] = tok
        done = torch.isin(tok, eos) if t + 1 < max_new else torch.ones_like(tok, dtype=torch.bool)
        ended = {}
        if out.stop:
            for i, r in enumerate(rows.rows.tolist()):
                n = out.stop_length(made[i, : t + 1].tolist(), checked[r])
                checked[r] = t + 1
                if n is not None:
                    ended[i] = n
        if done.any() or ended:
            for i in done.nonzero().squeeze(1).tolist():
                ended.setdefault(i, t + 1)
            for i, n in ended.items():
                out.finish(int(rows.rows[i]), made[i, :n].tolist(), list(range(1, n + 1)), t + 1)
            live = torch.ones_like(done)
            live[list(ended)] = False
            if not live.any():
                return
            made, tok = rows.keep(live, made, tok)
        last = tok[:, None]


def sbd_decode(rows: Rows, ids: torch.Tensor, out: Outputs, eos: torch.Tensor, max_new: int,
               block_size: int, gamma: float, proxy: str, mask_id: int, temperature: float, gen) -> None:
    """Set Block Decoding: each block starts as masks and is revealed by the EB rule; a finished
    block is committed in the first forward of the next one (docs/method.md §3)."""
    rows.forward(ids, n_commit=ids.shape[1], n_logits=1)
    b = ids.shape[0]
    made = torch.empty((b, max_new), dtype=torch.long, device=ids.device)
    steps = torch.zeros((b, max_new), dtype=torch.long, device=ids.device)
    nfe = torch.zeros(b, dtype=torch.long, device=ids.device)
    pending = ids[:, :0]
    produced = 0
    checked = [0] * b
    while True:
        k = min(block_size, max_new - produced)
        block = torch.full((pending.shape[0], k), mask_id, dtype=torch.long, device=ids.device)
        masked = torch.ones_like(block, dtype=torch.bool)
        when = torch.zeros_like(block)
        live = torch.ones(block.shape[0], dtype=torch.bool, device=ids.device)
        inputs, n_commit = torch.cat([pending, block], dim=1), pending.shape[1]
        while True:
            logits = rows.forward(inputs, n_commit=n_commit, n_logits=k)
            n_commit = 0
            logits[..., mask_id] = torch.finfo(logits.dtype).min  # never reveal the mask token itself
            h = error_proxy(logits, "entropy")  # the EB bound is on entropies whatever the proxy
            _check_finite(h)
            order = None if proxy == "entropy" else error_proxy(logits, proxy)
            picked = pick_tokens(logits, temperature, gen)
            # Positions after the first EOS that the block holds (revealed) or predicts (masked) are not
            # revealed: if that EOS stands they are discarded, so a forward spent on them is wasted.
            ends = torch.isin(torch.where(masked, picked, block), eos)
            todo = masked & live[:, None] & (ends.cumsum(-1) - ends.long() == 0)
            reveal = reveal_from_proxy(h, todo, gamma, order)
            block = torch.where(reveal, picked, block)
            masked &= ~reveal
            nfe += todo.any(-1)  # rows whose block is already revealed ride along without counting
            when = torch.where(reveal, nfe[:, None], when)
            is_eos = ends & ~masked  # revealed positions holding EOS
            eos_seen = bool((is_eos.any(-1) & live).any())
            ended = {}
            if eos_seen or out.stop:  # rare or opt-in: the common forward skips this bookkeeping
                known = (~masked).cumprod(-1).bool()  # revealed with every earlier position revealed
            if eos_seen:
                hit = (is_eos & known).any(-1) & live
                ended = {i: produced + int(is_eos[i].nonzero()[0]) + 1 for i in hit.nonzero().squeeze(1).tolist()}
            if out.stop:
                for i in live.nonzero().squeeze(1).tolist():
                    r = int(rows.rows[i])
                    upto = produced + int(known[i].sum())
                    seq = torch.cat([made[i, :produced], block[i]]).tolist()[:upto]
                    n = out.stop_length(seq, checked[r])
                    checked[r] = upto
                    if n is not None and (i not in ended or n < ended[i]):
                        ended[i] = n
            for i, n in ended.items():
                seq = torch.cat([made[i, :produced], block[i]])[:n].tolist()
                st = torch.cat([steps[i, :produced], when[i]])[:n].tolist()
                out.finish(int(rows.rows[i]), seq, st, int(nfe[i]))
                live[i] = False
            if not (masked & live[:, None]).any():
                break
            inputs = block
        made[:, produced : produced + k] = block
        steps[:, produced : produced + k] = when
        produced += k
        if produced >= max_new:
            for i in live.nonzero().squeeze(1).tolist():
                out.finish(int(rows.rows[i]), made[i].tolist(), steps[i].tolist(), int(nfe[i]))
            return
        if not live.all():
            if not live.any():
                return
            made, steps, nfe, block = rows.keep(live, made, steps, nfe, block)
        pending = block


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


def context_limit(model) -> int | None:
    """Longest sequence the model's positions and attention support (sliding windows count)."""
    cfg = model.config.get_text_config(decoder=True)
    limits = [getattr(cfg, "max_position_embeddings", None), getattr(cfg, "sliding_window", None)]
    limits = [int(x) for x in limits if isinstance(x, int) and x > 0]
    return min(limits) if limits else None


def encode_prompts(tokenizer, prompts) -> list[list[int]]:
    """Strings through the tokenizer, token-id lists as they are; empty input is an error."""
    if isinstance(prompts, (str, torch.Tensor)) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if prompts is None or len(prompts) == 0:
        raise SBDError("no prompts given: pass a non-empty list of strings or token-id lists")
    encoded = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise SBDError("string prompts need a tokenizer; pass token ids or the model's tokenizer")
            ids = tokenizer(p).input_ids
        elif isinstance(p, torch.Tensor):
            ids = p.flatten().tolist()
        else:
            ids = list(p)
        if not all(isinstance(t, int) for t in ids):
            raise SBDError(f"prompt {i} is neither a string nor a list of token ids")
        if len(ids) == 0:
            raise SBDError(f"prompt {i} is empty")
        encoded.append(ids)
    return encoded


def _validate(model, method, block_size, gamma, proxy, max_new_tokens, temperature, stop):
    if method not in METHODS:
        raise SBDError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if not isinstance(block_size, int) or block_size < 1:
        raise SBDError(f"block_size must be an integer >= 1, got {block_size!r}")
    if not isinstance(gamma, (int, float)) or math.isnan(gamma) or gamma < 0:
        raise SBDError(f"gamma must be a number >= 0 (inf allowed), got {gamma!r}")
    if proxy not in PROXIES:
        raise SBDError(f"unknown proxy {proxy!r}; choose one of {', '.join(PROXIES)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise SBDError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or math.isnan(temperature) or temperature < 0:
        raise SBDError(f"temperature must be a number >= 0, got {temperature!r}")
    if stop is not None and (isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop)):
        raise SBDError("stop must be a list of non-empty strings")
    if method == "sbd" and getattr(model.config, "sbd_mask_token_id", None) is None:
        raise SBDError(
            "this model has no SBD mask token (config.sbd_mask_token_id); add one with "
            "sbd.add_mask_token(model, tokenizer) and fine-tune it with `sbd train`, or use method='ntp'"
        )


def generate(
    model,
    tokenizer,
    prompts,
    *,
    method: str = "sbd",
    block_size: int = 16,
    gamma: float = 0.35,
    proxy: str = "entropy",
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    eos_token_ids: Sequence[int] | None = None,
    observer: Callable[[ForwardRecord], None] | None = None,
) -> GenerationResult:
    """Decode `prompts` with NTP or SBD. Every row is decoded as if it were alone and stops on its own.

    eos_token_ids: defaults to the tokenizer's and generation config's EOS; `[]` decodes to the budget.
    observer: called after every model forward with a `ForwardRecord` (tests use it to recompute).
    """
    _validate(model, method, block_size, gamma, proxy, max_new_tokens, temperature, stop)
    prompt_ids = encode_prompts(tokenizer, prompts)
    limit = context_limit(model)
    longest = max(len(p) for p in prompt_ids)
    if limit is not None and longest + max_new_tokens > limit:
        raise SBDError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of {limit}"
        )
    vocab = model.get_input_embeddings().num_embeddings
    if any(t < 0 or t >= vocab for p in prompt_ids for t in p):
        raise SBDError(f"a prompt token id lies outside the model's vocabulary of {vocab}")
    device = model.get_input_embeddings().weight.device
    if eos_token_ids is None:
        eos_token_ids = default_eos_ids(model, tokenizer)
    eos = torch.tensor(list(eos_token_ids), dtype=torch.long, device=device)
    gen = None
    if temperature > 0:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed if seed is not None else torch.seed())

    start = time.perf_counter()
    lengths = torch.tensor([len(p) for p in prompt_ids], device=device)
    ids = torch.zeros((len(prompt_ids), longest), dtype=torch.long, device=device)
    for i, p in enumerate(prompt_ids):
        ids[i, longest - len(p):] = torch.tensor(p, dtype=torch.long)
    pad = longest - lengths
    out = Outputs(len(prompt_ids), tokenizer, stop or [])
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            if method == "ntp":
                rows = Rows(model, pad, longest + max_new_tokens, observer)
                ntp_decode(rows, ids, out, eos, max_new_tokens, temperature, gen)
            else:
                k = min(block_size, max_new_tokens)
                rows = Rows(model, pad, longest + max_new_tokens + k, observer)
                sbd_decode(rows, ids, out, eos, max_new_tokens, k, float(gamma), proxy,
                           int(model.config.sbd_mask_token_id), temperature, gen)
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - start
    return GenerationResult(
        texts=out.texts(), token_ids=out.ids, nfe=out.nfe, steps=out.steps, seconds=seconds,
        method=method, prompt_lengths=[len(p) for p in prompt_ids],
    )

