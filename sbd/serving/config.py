"""How a server runs (`ServerConfig`), what a request may ask (`Limits`), and `server_config`, which builds
both from the options of `sbd serve` and checks them against the model."""

from __future__ import annotations

from dataclasses import dataclass

from ..decoding.generate import apply_chat
from ..decoding.spec import DecodeSpec, SpecError
from ..errors import SBDError
from ..models.facts import context_limit

MIB = 1 << 20
DEFAULT_MAX_TOKENS = 256  # a request's max_tokens when it sends none, where half the context holds it
MIN_MODEL_LEN = 16  # the shortest context served: a short prompt and an answer of a few tokens


@dataclass
class Limits:
    """Server-side defaults and limits for what a request may ask."""

    method: str = "sbd-verify"
    block_size: int | None = None  # None: the model's (an adapter's trained size, else 16)
    gamma: float = 0.35
    # greedy sbd-verify's drafting defaults for requests that leave them out; None: the model's measured
    # default (sbd.decoding.defaults), as sbd.generate uses it
    draft: str | None = None
    lookup: bool | None = None
    lookup_max: int | None = None
    tree: tuple[int, ...] | str | None = None
    max_tokens: int | None = None  # None: the server's `default_max_tokens` for its request length (256 where it fits)
    max_tokens_limit: int = 1024
    block_size_limit: int = 32
    lookup_max_limit: int = 64
    n_limit: int = 16


@dataclass
class ServerConfig:
    """How the server runs: the name clients use for the model, the engine's rows and queue, limits.

    max_body_bytes: larger request bodies get 413 before they are read. max_prompt_tokens: longer prompts
    get 400 (None: the request's whole length, `max_model_len` - 1). api_key: when set, every route but
    /health needs `Authorization: Bearer <api_key>`.
    """

    model_name: str = "sbd"
    max_batch: int = 8
    max_queue: int = 64
    max_model_len: int = 2048  # cache positions per request: prompt + max_tokens + scratch
    prefill: str = "separate"
    limits: Limits | None = None
    max_body_bytes: int = MIB
    max_prompt_tokens: int | None = None
    api_key: str | None = None


def server_config(model, *, model_path: str, served_name: str | None = None, max_batch: int = 8,
                  max_queue: int = 64, max_model_len: int | None = None, prefill: str = "separate",
                  method: str = "sbd-verify", draft: str | None = None, block_size: int | None = None,
                  gamma: float = 0.35, lookup: bool | None = None, lookup_max: int | None = None, tree=None,
                  max_tokens: int | None = None, max_tokens_limit: int = 1024,
                  max_body_bytes: int = MIB, max_prompt_tokens: int | None = None,
                  api_key: str | None = None, tokenizer=None) -> ServerConfig:
    """The configuration `sbd serve` runs with; SBDError names the first option the model cannot honour.
    max_tokens None: the server's `default_max_tokens` (256, or half of the request length when that is less).
    tokenizer: with a chat template, the context must also hold the template around a short message."""
    limit = context_limit(model) or 2048
    length = max_model_len or min(2048, limit)
    if length > limit:
        raise SBDError(f"--max-model-len {length} exceeds the model's context of {limit}")
    shortest = _template_tokens(tokenizer) + 1  # a chat request's prompt and one token
    if length < max(MIN_MODEL_LEN, shortest):
        need = (f"at least {MIN_MODEL_LEN}" if shortest <= MIN_MODEL_LEN else
                f"the chat template's own {shortest - 1} tokens and one more")
        raise SBDError(f"--max-model-len {length} is too short to serve: a request needs room for a prompt and at "
                       f"least one generated token ({need}); give a larger --max-model-len")
    if max_tokens is not None and max_tokens > max_tokens_limit:
        raise SBDError(f"--max-tokens {max_tokens} exceeds --max-tokens-limit {max_tokens_limit}")
    if max_tokens is not None and max_tokens >= length:
        raise SBDError(f"--max-tokens {max_tokens} leaves no room for a prompt within --max-model-len {length} "
                       f"(the default of requests that send no max_tokens); give at most {length - 1}")
    if max_prompt_tokens is not None and max_prompt_tokens >= length:
        raise SBDError(f"--max-prompt-tokens {max_prompt_tokens} leaves no room to generate within "
                       f"--max-model-len {length}")
    largest = Limits.block_size_limit
    if block_size is not None and block_size > largest:
        raise SBDError(f"--block-size {block_size} exceeds the largest block size a request may ask ({largest})")
    if lookup_max is not None and lookup_max > Limits.lookup_max_limit:
        raise SBDError(f"--lookup-max {lookup_max} exceeds the largest a request may ask ({Limits.lookup_max_limit})")
    # the server's defaults for requests, as one spec: refused here, at start-up, in sbd serve's words (a method
    # the drafter was not trained for too), not per request
    try:
        DecodeSpec.resolve(model, interface="serve", method=method, draft=draft, block_size=block_size,
                           lookup=lookup, lookup_max=lookup_max, tree=tree)
    except SpecError as e:
        raise SBDError(e.spelled("serve")) from None
    if api_key is not None and not api_key.strip():
        raise SBDError("--api-key (or SBD_API_KEY) is empty")
    limits = Limits(method=method, draft=draft, block_size=block_size, gamma=gamma, lookup=lookup,
                    lookup_max=lookup_max, tree=tree,
                    max_tokens=max_tokens, max_tokens_limit=max_tokens_limit)
    name = served_name or str(model_path).rstrip("/").rsplit("/", 1)[-1]
    return ServerConfig(model_name=name, max_batch=max_batch, max_queue=max_queue, max_model_len=length,
                        prefill=prefill, limits=limits, max_body_bytes=max_body_bytes,
                        max_prompt_tokens=max_prompt_tokens, api_key=api_key)


def _template_tokens(tokenizer) -> int:
    """Tokens of the tokenizer's chat template around one empty user message (0 without a template)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return 0
    try:
        return len(apply_chat(tokenizer, [{"role": "user", "content": ""}]))
    except Exception:  # a template that needs more than one message: no floor from it
        return 0
