"""How a server runs (`ServerConfig`), what a request may ask (`Limits`), and `server_config`, which builds
both from the options of `sbd serve` and checks them against the model."""

from __future__ import annotations

from dataclasses import dataclass

from ..decoding.defaults import VerifySettings, model_defaults, tree_setting
from ..decoding.generate import context_limit
from ..decoding.trained_for import check_decoding
from ..errors import SBDError

MIB = 1 << 20


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
    max_tokens: int = 256
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
                  max_tokens: int = 256, max_tokens_limit: int = 1024,
                  max_body_bytes: int = MIB, max_prompt_tokens: int | None = None,
                  api_key: str | None = None) -> ServerConfig:
    """The configuration `sbd serve` runs with; SBDError names the first option the model cannot honour."""
    limit = context_limit(model) or 2048
    length = max_model_len or min(2048, limit)
    if length > limit:
        raise SBDError(f"--max-model-len {length} exceeds the model's context of {limit}")
    if max_tokens > max_tokens_limit:
        raise SBDError("--max-tokens exceeds --max-tokens-limit")
    if max_prompt_tokens is not None and max_prompt_tokens >= length:
        raise SBDError(f"--max-prompt-tokens {max_prompt_tokens} leaves no room to generate within "
                       f"--max-model-len {length}")
    if method != "sbd-verify":
        for name, value in (("--draft", draft if draft != "block" else None), ("--lookup", lookup or None),
                            ("--lookup-max", lookup_max), ("--tree", tree)):
            if value is not None:
                raise SBDError(f"{name} applies to --method sbd-verify")
    if tree is not None:
        tree_setting(tree)  # a malformed shape is refused at start-up, not per request
    largest = Limits.block_size_limit
    if block_size is not None and block_size > largest:
        raise SBDError(f"--block-size {block_size} exceeds the largest block size a request may ask ({largest})")
    if lookup_max is not None and lookup is False:
        raise SBDError("--lookup-max sets the longest prompt-lookup draft; it has no effect with --no-lookup")
    if lookup_max is not None and lookup_max > Limits.lookup_max_limit:
        raise SBDError(f"--lookup-max {lookup_max} exceeds the largest a request may ask ({Limits.lookup_max_limit})")
    check_decoding(model, method)  # --method sbd on a drafter not trained for it: refused here, not per request
    if api_key is not None and not api_key.strip():
        raise SBDError("--api-key (or SBD_API_KEY) is empty")
    limits = Limits(method=method, draft=draft, block_size=block_size, gamma=gamma, lookup=lookup,
                    lookup_max=lookup_max, tree=tree,
                    max_tokens=max_tokens, max_tokens_limit=max_tokens_limit)
    name = served_name or str(model_path).rstrip("/").rsplit("/", 1)[-1]
    return ServerConfig(model_name=name, max_batch=max_batch, max_queue=max_queue, max_model_len=length,
                        prefill=prefill, limits=limits, max_body_bytes=max_body_bytes,
                        max_prompt_tokens=max_prompt_tokens, api_key=api_key)


def server_defaults(model, limits: Limits) -> VerifySettings:
    """Greedy sbd-verify's drafting settings for requests that leave them out: the server's options where
    given, else the model's measured defaults (the same as `sbd.generate`'s)."""
    base = model_defaults(model)
    tree = tree_setting(limits.tree)
    return VerifySettings(draft=limits.draft or base.draft,
                          lookup=base.lookup if limits.lookup is None else limits.lookup,
                          lookup_max=limits.lookup_max or base.lookup_max,
                          tree=base.tree if tree == "default" else tree,
                          fallback=base.fallback and limits.draft is None)
