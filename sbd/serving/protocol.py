"""The request bodies the server accepts, checked into `Options`: every OpenAI field is honoured or refused
with a 400 that names it, and fields OpenAI does not know are refused as OpenAI refuses them.

sbd adds `method`, `block_size`, `gamma`, `proxy`, `anchor`, `draft`, `lookup`, `lookup_max` and `tree`. Two
deliberate differences from OpenAI: `temperature` defaults to 0 and `method` to sbd-verify, so a client
that asks nothing gets the model's own greedy answer, drafted with the model's fastest exact settings. docs/serving.md lists every field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..decoding.defaults import GENERAL, VerifySettings
from ..decoding.spec import DecodeSpec, SpecError
from ..models.facts import ModelFacts
from .config import DEFAULT_MAX_TOKENS, Limits
from .errors import APIError

METHODS = ("sbd-verify", "sbd", "ntp")
ROLES = ("system", "developer", "user", "assistant")
INT64 = (-(1 << 63), (1 << 63) - 1)
MAX_STOP_CHARS = 256
MAX_LOGIT_BIAS = 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None  # usage rides on the last chunk either way


class DecodingFields(_Strict):
    """Fields shared by both endpoints (None: the server's default)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: Any = None  # a string or up to 4 strings
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # an end-user id for the caller's own records; nothing to do here
    method: str | None = None
    block_size: int | None = None
    gamma: float | None = None
    proxy: str | None = None
    anchor: bool | None = None
    draft: str | None = None
    lookup: bool | None = None
    lookup_max: int | None = None
    tree: Any = None  # widths per depth ([3, 2] or "3,2"), or "chain"


class CompletionRequest(DecodingFields):
    prompt: Any = None  # a string, a list of one string, or token ids
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(_Strict):
    role: str
    content: Any = None  # a string or a list of {"type": "text", "text": ...} parts


class ChatRequest(DecodingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None


@dataclass
class Options:
    """A request after defaults and checks: how to decode it (`spec`) and what the request itself asks
    (n choices, a seed, streaming, echo)."""

    spec: DecodeSpec
    seed: int | None = None
    stream: bool = False
    n: int = 1
    echo: bool = False
    max_tokens_given: bool = True  # False: the server's default max_tokens (an error then says so)


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def text(value: str, param: str) -> str:
    """`value` if it can be encoded as UTF-8 (JSON may carry lone surrogates, which cannot)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{param} is not valid Unicode text (a lone surrogate?)", param) from None
    return value


def _number(value, param: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or not low <= value <= high:
        raise bad(f"{param} must be between {low:g} and {high:g}", param)
    return float(value)


def _refuse_openai_extras(req) -> None:
    """OpenAI fields this server cannot honour: their no-op values pass, anything else is a 400."""
    if isinstance(req, CompletionRequest):
        if req.best_of not in (None, 1):
            raise bad("best_of is not supported (only 1): ask for n choices instead", "best_of")
        if req.suffix not in (None, ""):
            raise bad("suffix (insertion) is not supported", "suffix")
        return
    fmt = req.response_format
    if fmt is not None and fmt != {"type": "text"}:
        raise bad("response_format is not supported; only {\"type\": \"text\"} (constrained JSON output is not "
                  "implemented)", "response_format")
    for name, allowed in (("tools", (None,)), ("tool_choice", (None, "none")), ("parallel_tool_calls", (None,)),
                          ("functions", (None,)), ("function_call", (None, "none"))):
        if getattr(req, name) not in allowed:
            raise bad(f"{name} is not supported: this server does not call tools", name)


def stop_strings(value) -> list[str]:
    stop = [value] if isinstance(value, str) else value if value is not None else []
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise bad("stop is a string or up to 4 non-empty strings", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise bad(f"a stop string is longer than {MAX_STOP_CHARS} characters", "stop")
    return [text(s, "stop") for s in stop]


def _logit_bias(value: dict[str, float] | None, vocab: int, mask_id: int | None) -> dict[int, float]:
    if not value:
        return {}
    if len(value) > MAX_LOGIT_BIAS:
        raise bad(f"logit_bias holds at most {MAX_LOGIT_BIAS} tokens", "logit_bias")
    out = {}
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit()) or not 0 <= int(key) < vocab or key != str(int(key)):
            raise bad(f"logit_bias key {key!r} is not a token id of this model (0..{vocab - 1}, written without "
                      "leading zeros)", "logit_bias")
        if int(key) == mask_id:
            raise bad(f"logit_bias: token {key} is the SBD mask token, reserved for decoding", "logit_bias")
        if not math.isfinite(bias) or not -100 <= bias <= 100:
            raise bad("logit_bias values must be between -100 and 100", "logit_bias")
        out[int(key)] = float(bias)
    return out


def _logprobs(req) -> tuple[int | None, bool]:
    """(alternatives per token or None, echo) for either endpoint."""
    if isinstance(req, CompletionRequest):
        if req.logprobs is not None and not 0 <= req.logprobs <= 5:
            raise bad("logprobs must be between 0 and 5", "logprobs")
        if req.echo and req.logprobs is not None:
            raise bad("echo with logprobs is not supported (the prompt's own logprobs are not computed)", "echo")
        return req.logprobs, bool(req.echo)
    if req.top_logprobs is not None:
        if not 0 <= req.top_logprobs <= 20:
            raise bad("top_logprobs must be between 0 and 20", "top_logprobs")
        if not req.logprobs:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None, False


def options(req: DecodingFields, limits: Limits, facts: ModelFacts, defaults: VerifySettings = GENERAL) -> Options:
    """Defaults filled in and every value checked; an APIError (400) names the first bad field.
    What a request may ask of this server (its limits) is checked here; how the settings go together,
    and what a left-out one means, by the decoding spec (`sbd.decoding.spec`), as for every entry point.
    defaults: greedy sbd-verify's drafting settings for fields a request leaves out (the model's measured
    ones with the server's options over them, `Server.defaults`)."""
    _refuse_openai_extras(req)
    n = 1 if req.n is None else req.n
    if not 1 <= n <= limits.n_limit:
        raise bad(f"n must be between 1 and {limits.n_limit}", "n")
    method = req.method or limits.method
    if method not in METHODS:
        raise bad(f"method must be one of {', '.join(METHODS)}", "method")
    if req.block_size is not None and not 1 <= req.block_size <= limits.block_size_limit:
        raise bad(f"block_size must be between 1 and {limits.block_size_limit}", "block_size")
    if req.lookup_max is not None and not 1 <= req.lookup_max <= limits.lookup_max_limit:
        raise bad(f"lookup_max must be between 1 and {limits.lookup_max_limit}", "lookup_max")
    if req.tree is not None and not (isinstance(req.tree, str) or (isinstance(req.tree, list) and all(
            isinstance(w, int) and not isinstance(w, bool) for w in req.tree))):
        raise bad('tree is a list of widths per depth such as [3, 2], "3,2", or "chain"', "tree")
    max_tokens = req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        if max_tokens is not None and max_tokens != req.max_completion_tokens:
            raise bad("max_tokens and max_completion_tokens differ; give one", "max_completion_tokens")
        max_tokens = req.max_completion_tokens
    given = max_tokens is not None
    if not given:
        max_tokens = limits.max_tokens if limits.max_tokens is not None else DEFAULT_MAX_TOKENS
    if not 1 <= max_tokens <= limits.max_tokens_limit:
        raise bad(f"max_tokens must be between 1 and {limits.max_tokens_limit}", "max_tokens")
    if req.seed is not None and not INT64[0] <= req.seed <= INT64[1] - (n - 1):
        raise bad("seed must be a 64-bit signed integer (with n choices, seed + n - 1 too)", "seed")
    logprobs, echo = _logprobs(req)
    if limits.block_size is not None:  # the server's --block-size: a default, as the model's own would be
        facts = replace(facts, block_size=limits.block_size)
    try:  # what the request sent (None: left out, the defaults), so that the spec refuses a field nothing reads
        spec = DecodeSpec.build(
            facts, defaults=defaults, method=method, block_size=req.block_size,
            gamma=req.gamma, proxy=req.proxy, anchor=req.anchor, draft=req.draft, lookup=req.lookup,
            lookup_max=req.lookup_max, tree=req.tree, max_new_tokens=max_tokens,
            temperature=_number(req.temperature, "temperature", 0, 2), stop=stop_strings(req.stop) or None,
            logit_bias=_logit_bias(req.logit_bias, facts.vocab, facts.mask_id) if req.logit_bias is not None else None,
            presence_penalty=_number(req.presence_penalty, "presence_penalty", -2, 2),
            frequency_penalty=_number(req.frequency_penalty, "frequency_penalty", -2, 2),
            top_p=_number(req.top_p, "top_p", 0, 1), logprobs=logprobs)
    except SpecError as e:
        raise bad(e.spelled("http"), e.param) from None
    if req.gamma is None:  # the server's --gamma, where the EB rule reads it
        spec = replace(spec, gamma=limits.gamma)
    return Options(spec, seed=req.seed, stream=bool(req.stream), n=n, echo=echo, max_tokens_given=given)


def prompt_of(req: CompletionRequest) -> str | list[int]:
    """The prompt as one string or one list of token ids."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise bad("one prompt per request (a list of one string, or token ids); ask for n choices with n",
                      "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("the prompt is empty", "prompt")
        return text(prompt, "prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not prompt:
            raise bad("the prompt is empty", "prompt")
        return prompt
    raise bad("prompt is a string, a list of one string, or a list of token ids", "prompt")


def messages_of(req: ChatRequest) -> list[dict]:
    """The conversation for the chat template: roles checked (developer is system), text parts joined."""
    if not req.messages:
        raise bad("messages is empty", "messages")
    out = []
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if m.role not in ROLES:
            raise bad(f"{where}.role must be one of {', '.join(ROLES)}; got {m.role!r}", f"{where}.role")
        content = m.content
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and set(part) == {"type", "text"}
                        and isinstance(part["text"], str)):
                    raise bad(f"{where}.content[{j}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                              "supported", f"{where}.content[{j}]")
                parts.append(part["text"])
            content = "\n".join(parts)
        if not isinstance(content, str):
            raise bad(f"{where}.content is a string or a list of text parts", f"{where}.content")
        out.append({"role": "system" if m.role == "developer" else m.role,
                    "content": text(content, f"{where}.content")})
    return out
