"""`generate`: decode prompts with NTP or SBD (docs/method.md §3).

Resolves the settings into a `DecodeSpec` (`sbd.decoding.spec`: defaults and checks, in one place),
encodes the prompts, decodes them as rows of the engine
(`sbd.decoding.engine`, each row at its own pace) and returns a `GenerationResult` with the tokens and what they cost.
"""

from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..drafters.sampler_head import head_of
from ..errors import SBDError
from ..models.facts import ModelFacts, context_limit
from ..modes import eval_mode
from .defaults import VerifySettings
from .engine import Engine, ForwardRecord
from .kinds import make_row
from .spec import DecodeSpec, SpecError
from .trained_for import check_decoding
from .width_cost import forward_costs


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
    accepted: list[list[int]] = field(default_factory=list)  # sbd-verify: draft tokens kept at each forward
    lookup_accepted: list[int] = field(default_factory=list)  # sbd-verify, lookup=True: of those, from lookup
    # logprobs=k: per row, per token (token_id, logprob, [(alt_id, alt_logprob), … the k most likely]),
    # from the raw next-token head (temperature 1, before logit_bias, penalties and top_p); else None
    logprobs: list[list[tuple[int, float, list[tuple[int, float]]]]] | None = None
    settings: VerifySettings | None = None  # sbd-verify: the drafting settings it ran with (defaults resolved)
    weights: str = ""  # the base model's linear layers as they ran ("int4, exactly as stored", "float32", …)

    @property
    def mean_accepted(self) -> float:
        """sbd-verify: draft tokens accepted per forward, over all rows (0 for the other methods)."""
        counts = [a for row in self.accepted for a in row]
        return sum(counts) / len(counts) if counts else 0.0

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


_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def compiled(model):
    """The model's forward through `torch.compile`, made once per model: fixed shapes (dynamic=False);
    on CUDA "reduce-overhead", i.e. captured as CUDA graphs and replayed."""
    if model not in _COMPILED:
        device = model.get_input_embeddings().weight.device
        mode = "reduce-overhead" if device.type == "cuda" else None
        _COMPILED[model] = torch.compile(model, dynamic=False, mode=mode)
    return _COMPILED[model]


def apply_chat(tokenizer, prompt) -> list[int]:
    """A user message (a string) or a whole conversation (a list of {"role", "content"} dicts) through
    the tokenizer's chat template, ending with the assistant's turn opened; token ids."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if not messages or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise SBDError("a chat prompt is a string or a list of {'role': ..., 'content': ...} messages")
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):  # spelled per interface (--chat)
        raise SpecError("chat", "{chat=True} needs a tokenizer with a chat template (this one has none); pass plain "
                                "prompts without {chat=True}")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids  # the template already holds any BOS


def _check_text(text: str, i: int) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # e.g. a command-line argument in another encoding (surrogate-escaped bytes)
        raise SBDError(f"prompt {i} is not valid UTF-8 text") from None


def encode_prompts(tokenizer, prompts, chat: bool = False) -> list[list[int]]:
    """Strings through the tokenizer (through its chat template when `chat`), token-id lists as they
    are; empty input is an error."""
    single_conversation = chat and isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], dict)
    if isinstance(prompts, (str, torch.Tensor)) or single_conversation or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if prompts is None or len(prompts) == 0:
        raise SBDError("no prompts given: pass a non-empty list of strings or token-id lists")
    encoded = []
    for i, p in enumerate(prompts):
        if chat and (isinstance(p, str) or (isinstance(p, (list, tuple)) and p and isinstance(p[0], dict))):
            if isinstance(p, str):
                _check_text(p, i)
            ids = apply_chat(tokenizer, p)
        elif isinstance(p, str):
            _check_text(p, i)
            if tokenizer is None:
                raise SBDError("string prompts need a tokenizer; pass token ids or the model's tokenizer")
            ids = tokenizer(p).input_ids
        elif isinstance(p, torch.Tensor):
            ids = p.flatten().tolist()
        elif isinstance(p, (list, tuple)):
            ids = list(p)
        else:
            raise SBDError(f"prompt {i} is {type(p).__name__}, not a string or a list of token ids")
        if not all(isinstance(t, int) for t in ids):
            raise SBDError(f"prompt {i} is neither a string nor a list of token ids")
        if len(ids) == 0:
            raise SBDError(f"prompt {i} is empty")
        encoded.append(ids)
    return encoded


def check_context(model, prompt_ids: list[list[int]], max_new_tokens: int) -> None:
    """The longest prompt plus the budget fits the model's context, or SBDError saying by how much."""
    limit = context_limit(model)
    longest = max(len(p) for p in prompt_ids)
    if limit is not None and longest + max_new_tokens > limit:
        raise SBDError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of {limit}"
        )


def mask_message(tokenizer, mask_id: int, messages) -> int | None:
    """The index of the first chat message whose content holds the SBD mask token, or None."""
    for j, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str) and tokenizer is not None and int(mask_id) in tokenizer(
                content, add_special_tokens=False).input_ids:
            return j
    return None


def _prompt_name(tokenizer, mask_id: int, prompts, chat: bool, i: int) -> str:
    """How an error names prompt i of `prompts` (as the caller passed them): "the prompt" when one was
    passed alone, the message holding the mask token for a conversation ("messages[2].content")."""
    if prompts is None:
        return f"prompt {i}"
    single = isinstance(prompts, (str, torch.Tensor)) or (isinstance(prompts, (list, tuple)) and len(prompts) > 0 and (
        isinstance(prompts[0], int) or (chat and isinstance(prompts[0], dict))))
    if not single and not (isinstance(prompts, (list, tuple)) and i < len(prompts)):
        return f"prompt {i}"
    source, name = (prompts, "the prompt") if single else (prompts[i], f"prompt {i}")
    if chat and isinstance(source, (list, tuple)) and source and isinstance(source[0], dict):
        j = mask_message(tokenizer, mask_id, source)
        if j is not None:
            return f"messages[{j}].content" if single else f"{name}, messages[{j}].content"
    return name


def check_prompt_ids(model, tokenizer, prompt_ids: list[list[int]], prompts=None, chat: bool = False) -> None:
    """Every prompt token lies in the vocabulary and none is the SBD mask token (whose text in a prompt
    would otherwise be read as a mask and derail decoding): the one rule, for every entry point.
    prompts (and chat): what the caller passed, so that an error names the prompt as the caller knows it
    (a conversation's message: "messages[2].content")."""
    vocab = model.get_input_embeddings().num_embeddings
    if any(t < 0 or t >= vocab for p in prompt_ids for t in p):
        raise SBDError(f"a prompt token id lies outside the model's vocabulary of {vocab}")
    mask_id = getattr(model.config, "sbd_mask_token_id", None)
    if mask_id is not None:
        for i, p in enumerate(prompt_ids):
            if mask_id in p:
                text = tokenizer.convert_ids_to_tokens(int(mask_id)) if tokenizer is not None else f"id {mask_id}"
                raise SBDError(f"{_prompt_name(tokenizer, mask_id, prompts, chat, i)} contains the SBD mask token "
                               f"{text!r}; it is reserved for decoding and cannot appear in a prompt")


def generate(model, tokenizer, prompts, spec: DecodeSpec | None = None, *, seed: int | Sequence[int] | None = None,
             eos_token_ids: Sequence[int] | None = None, observer: Callable[[ForwardRecord], None] | None = None,
             chat: bool = False, engine: dict | None = None, **options) -> GenerationResult:
    """Decode `prompts` with NTP, SBD or SBD with verified drafts. Every row stops on its own.

    spec: how to decode (`sbd.decoding.spec.DecodeSpec.resolve(model, ...)`); or leave it out and give
    the settings below as keywords (they are resolved into one). seed, eos_token_ids, observer, chat and
    engine belong to the call. draft_options: sbd-verify's drafting switches for experiments
    (`sbd.decoding.draft_policy.DraftOptions`; default: the measured best).

    method: "sbd-verify" (the default) drafts with the masked head and checks every draft token with the
    model's own next-token predictions: exactly NTP's output (greedy: the same tokens; sampling: the same
    distribution) in fewer forwards when the drafts are good; "ntp" one token per forward; "sbd" the
    paper's decoding, blocks revealed by the EB rule (gamma, proxy), several tokens per forward but not
    the model's own answers, and refused for a model whose drafter was not trained for it
    (`sbd.decoding.trained_for`).

    gamma (default 0.35) and proxy (default "entropy"): the EB rule's bound and uncertainty proxy, read by
    method "sbd" and by sbd-verify with draft "eb" only; given to any other decoding they are refused.

    anchor (method "sbd"): plain SBD anchored on the model's own next token (`sbd.decoding.anchored`):
    each forward reveals the next-token head's token, then the masks' tokens after it left to right while
    their entropies sum to at most gamma, and commits them at once; the block fed is always all masks,
    so a drafter trained for sbd-verify's drafts serves it. Not verified: not always NTP's tokens.

    block_size: tokens per block; default: the block size a drafting adapter was trained for, else the one
    the model records (`sbd.decoding.defaults`), else 16.
    Drafting settings of sbd-verify (draft, lookup, lookup_max, tree): each one left out (None) is the
    fastest exact greedy configuration measured for this model (`sbd.decoding.defaults`: recorded by its
    drafting adapter or its config, else whole-block chain drafts without lookup); with sampling they
    are the plain ones (whole blocks, no lookup, a chain). Set any of them to switch it:
    draft: "block" takes the whole block the masked head predicts in the verifying forward as the draft
    (gamma and proxy do not apply: refused); "eb" first reveals it with the EB rule (gamma, proxy) over
    forwards of its own, as SBD would — better drafts for more forwards; greedy only; "adaptive" lets
    each row choose how many masks to feed (at most block_size) from its own acceptance so far and the
    cost of wider steps on this model (`sbd.decoding.width_cost`: learnt from the engine's own steps, kept
    per model shape, batch size and machine; nothing is timed before decoding):
    shorter drafts where they are often refused or forwards are compute-bound, plain next-token steps
    (with an occasional probe) where no draft pays; a draft of the masks' own chain also ends before the
    first place where the masks are unsure (`sbd.decoding.rows.confident_length`).
    lookup (greedy, draft "block" or "adaptive"): when the last 3 (else 2) tokens occurred earlier in
    the prompt or the output, draft what followed them there (prompt lookup) instead of the masks'
    draft; the tokens are still NTP's. `lookup_accepted` counts the kept draft tokens it proposed.
    lookup_max: the longest lookup draft (16 unless the model records another, independent of
    block_size): the draft runs as long as the earlier occurrence goes on (then repeats it) up to this
    cap; a forward verifying a lookup draft feeds no masks (they would only draft a forward that lookup
    drafts anyway).
    tree (greedy, draft "block" or "adaptive"): widths per depth such as (3, 2, 1) (or "3,2,1"); "chain"
    (or ()) for one chain: each verifying forward carries a small tree instead of one chain — the chain
    as its main branch plus, at depth d, the w_d most likely extensions by the masks' top candidates
    (and, with lookup, the masks' chain besides lookup's); the longest path greedy decoding would
    produce is kept (`sbd.decoding.trees`). The tokens are still NTP's; `accepted` counts the kept nodes.

    seed (temperature > 0): an int (row i samples with seed + i) or one int per prompt; each row draws
    from its own stream, so a row samples the same alone as in any batch.
    eos_token_ids: defaults to the tokenizer's and generation config's EOS; `[]` decodes to the budget; an id
    outside the model's vocabulary is refused (it could never end a row).
    observer: called after every model forward with a `ForwardRecord` (tests use it to recompute).
    engine: how the engine runs the forwards, for comparisons (`sbd.decoding.engine.Engine`'s options):
    {"attention": "dense"} gives the model the dense mask instead of sbd's attention plans;
    {"causal_blocks": True} lets masks attend causally among themselves (an engine with causal attention
    only, as vLLM's CPU backend); {"lean": False} runs transformers' own modules instead of sbd's forward of
    Llama-family models (`sbd.decoding.llama_forward`: the same logits bit for bit, faster). The tokens of
    sbd-verify are the same either way.
    static_shapes: pad every decoding forward to one of a few fixed widths (NTP 1; SBD k and 2k; sbd-verify
    also the powers of two below its widest) over a cache of fixed size, so that its shapes never change
    (same tokens, a little more work per forward).
    compile: run those forwards through `torch.compile` (CUDA: with CUDA graphs); implies static_shapes.
    The first call per model and width compiles (seconds to minutes; a later call that meets a new width
    compiles it); later calls reuse them. A drafting adapter runs inside the compiled forwards; a sampler head does not (it reads the hidden states
    through a hook): compiled sbd-verify drafts from the masks alone, and says so in a warning.
    reveal_per_forward (method "sbd" only): instead of the EB rule, reveal the first r still-masked
    positions of the block every forward — a fixed schedule for timing the loop (e.g. on a model with
    random weights), not a decoding rule.
    chat: put each string prompt through the tokenizer's chat template as a user message (a prompt may
    also be a list of {"role", "content"} messages), with the assistant's turn opened.

    OpenAI's processors (methods "ntp" and "sbd-verify"; they act on the next-token head, so sbd-verify
    still gives exactly NTP's output under them; `sbd.decoding.processing.Processing`):
    logit_bias {token id: -100..100} added to the logits; presence_penalty and frequency_penalty
    (-2..2) subtracted once / per occurrence for every token already generated (the prompt does not
    count); top_p (0, 1] samples from the nucleus (temperature > 0). logprobs=k (0..20): `logprobs`
    of the result holds, for every returned token, its logprob and the k most likely alternatives,
    read from the model's raw next-token distribution (temperature 1, before bias, penalties, top_p).
    """
    if spec is None:
        spec = DecodeSpec.resolve(model, **options)
    elif options:
        raise SBDError(f"pass the decoding settings in the spec or as keywords, not both (got spec and "
                       f"{', '.join(sorted(options))})")
    else:
        check_decoding(model, spec.method, anchor=spec.anchor)
    engine_kw = _engine_options(engine)
    if spec.compile and spec.method == "sbd-verify" and getattr(head_of(model), "enabled", False):
        warnings.warn("sbd: compile=True drafts without the sampler head (it reads hidden states through a hook "
                      "compiled forwards do not run): the masks draft alone, the tokens are the same; load with "
                      "sampler_head=False to say so", stacklevel=2)
    facts = ModelFacts.of(model, tokenizer)
    prompt_ids = encode_prompts(tokenizer, prompts, chat)
    check_context(model, prompt_ids, spec.max_new_tokens)
    check_prompt_ids(model, tokenizer, prompt_ids, prompts, chat)
    seeds = row_seeds(seed, len(prompt_ids), spec.temperature)
    eos = list(facts.end_ids(eos_token_ids))
    adaptive = spec.method == "sbd-verify" and spec.draft == "adaptive"
    cost = forward_costs(model, batch=len(prompt_ids)) if adaptive else None

    start = time.perf_counter()
    rows = [make_row(spec, p, mask_id=facts.mask_id, eos=eos, tokenizer=tokenizer, seed=s, device=facts.device,
                     cost=cost) for p, s in zip(prompt_ids, seeds)]
    engine = Engine(model, len(rows), max(r.needs for r in rows), max_width=max(
        [2 * spec.block_size + 1] + [r.needs_extra for r in rows]),  # a row's extra room = its widest forward
        observer=observer, static_widths=static_widths(spec), call=compiled(model) if spec.compile else None,
        step_cost=cost, **engine_kw)
    with eval_mode(model), torch.inference_mode():
        for r in rows:
            engine.add(r)
        while engine.live:
            engine.step()
    seconds = time.perf_counter() - start
    if cost is not None and hasattr(cost, "save"):
        cost.save()  # what this call's steps said of wider steps, averaged into the kept estimate
    return GenerationResult(
        texts=[r.text() for r in rows], token_ids=[r.out for r in rows], nfe=[r.nfe for r in rows],
        steps=[r.steps for r in rows], seconds=seconds, method=spec.method,
        prompt_lengths=[len(p) for p in prompt_ids], accepted=[r.accepted for r in rows],
        lookup_accepted=[r.lookup_accepted for r in rows],
        logprobs=[r.logprobs for r in rows] if spec.processing.logprobs is not None else None,
        settings=spec.settings, weights=facts.held,
    )


def _engine_options(engine: dict | None) -> dict:
    """`generate`'s engine options, checked: only those a comparison may change."""
    if engine is None:
        return {}
    if not isinstance(engine, dict) or set(engine) - {"attention", "causal_blocks", "lean"}:
        raise SBDError(f"engine takes {{'attention': 'auto' | 'dense', 'causal_blocks': bool, 'lean': bool}}, "
                       f"got {engine!r}")
    if engine.get("lean", None) not in (None, True, False):
        raise SBDError(f"engine['lean'] is True, False or None (where supported), got {engine['lean']!r}")
    return dict(engine)


def static_widths(spec: DecodeSpec) -> tuple[int, ...]:
    """The fixed forward widths of static shapes (none without): NTP 1; SBD k and 2k; with lookup also a
    lookup forward (the head and a draft of at most the budget's, no masks); sbd-verify also every power of
    two below its widest forward. A forward is padded to the next of these widths, so an adaptive draft of 3
    tokens runs 4 wide, not 2k + 1: padding every step to the widest made compiled SmolLM2 0.7x eager on a
    CPU, and the ladder 1.07x (docs/performance.md). A width compiles on its first use only."""
    if not spec.fixed_shapes:
        return ()
    if spec.method == "ntp":
        return (1,)
    k = min(spec.block_size, spec.max_new_tokens)
    widths = {k, 2 * k}
    if spec.lookup:
        widths.add(1 + min(spec.lookup_max, spec.max_new_tokens - 1))
    if spec.method == "sbd-verify":
        widths |= {1 << i for i in range(max(widths).bit_length()) if 1 << i < max(widths)}
    return tuple(sorted(widths))


def row_seeds(seed, n: int, temperature: float) -> list[int | None]:
    """One seed per row, so that a row samples the same alone or in any batch: an int gives rows
    seed, seed + 1, …; a list gives each row its own; None draws fresh seeds."""
    if temperature <= 0:
        return [None] * n
    if seed is None:
        return [torch.seed() for _ in range(n)]
    if isinstance(seed, int) and not isinstance(seed, bool):
        return [seed + i for i in range(n)]
    if isinstance(seed, (list, tuple)) and len(seed) == n and all(isinstance(x, int) for x in seed):
        return list(seed)
    raise SBDError(f"seed must be an integer or a list of {n} integers (one per prompt), got {seed!r}")

