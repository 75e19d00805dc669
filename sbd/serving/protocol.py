"""The OpenAI API shapes the server speaks: request bodies checked into `Options`, responses and errors.

Request fields follow OpenAI's completions and chat completions; sbd adds `method`, `block_size`,
`gamma`, `proxy` and `draft`. Two deliberate differences: `temperature` defaults to 0 and `method` to
sbd-verify, so a client that asks nothing gets the model's own greedy answer; `n` must be 1.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

METHODS = ("sbd-verify", "sbd", "ntp")


class APIError(Exception):
    """An error returned to the client as OpenAI's {"error": {...}} body with an HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class DecodingFields(BaseModel):
    """Fields shared by both endpoints (None: the server's default)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None)
    max_completion_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = 1
    logprobs: object | None = None
    method: str | None = None
    block_size: int | None = None
    gamma: float | None = None
    proxy: str | None = None
    draft: str | None = None


class CompletionRequest(DecodingFields):
    prompt: str | list[int] | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str


class ChatRequest(DecodingFields):
    messages: list[ChatMessage]


@dataclass
class Limits:
    """Server-side defaults and limits for what a request may ask."""

    method: str = "sbd-verify"
    draft: str = "adaptive"
    block_size: int | None = None  # None: the model's (an adapter's trained size, else 16)
    gamma: float = 0.35
    max_tokens: int = 256
    max_tokens_limit: int = 1024
    block_size_limit: int = 32


@dataclass
class Options:
    """A request's decoding options after defaults and checks."""

    method: str
    block_size: int
    gamma: float
    proxy: str
    draft: str
    max_tokens: int
    temperature: float
    seed: int | None
    stop: list[str] = field(default_factory=list)
    stream: bool = False


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def options(req: DecodingFields, limits: Limits, default_block: int) -> Options:
    """Defaults filled in and every value checked; an APIError (400) names the first bad field."""
    if req.n != 1:
        raise _bad("only n=1 is supported", "n")
    if req.logprobs not in (None, False, 0):
        raise _bad("logprobs are not supported", "logprobs")
    method = req.method or limits.method
    if method not in METHODS:
        raise _bad(f"method must be one of {', '.join(METHODS)}", "method")
    block = req.block_size if req.block_size is not None else (limits.block_size or default_block)
    if not 1 <= block <= limits.block_size_limit:
        raise _bad(f"block_size must be between 1 and {limits.block_size_limit}", "block_size")
    gamma = limits.gamma if req.gamma is None else req.gamma
    if math.isnan(gamma) or gamma < 0:
        raise _bad("gamma must be a number >= 0", "gamma")
    proxy = req.proxy or "entropy"
    if proxy not in ("entropy", "confidence", "margin"):
        raise _bad("proxy must be entropy, confidence or margin", "proxy")
    # the server's default draft is sbd-verify's, and greedy only when adaptive (with sampling, timed draft
    # lengths would make a seed stop reproducing the sample)
    temperature = 0.0 if req.temperature is None else req.temperature
    default = limits.draft if method == "sbd-verify" else "block"
    draft = req.draft or (default if not (default == "adaptive" and temperature > 0) else "block")
    if draft not in ("block", "eb", "adaptive") or (draft != "block" and method != "sbd-verify"):
        raise _bad("draft is block, eb or adaptive, and eb and adaptive apply to method sbd-verify only", "draft")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = limits.max_tokens if max_tokens is None else max_tokens
    if not 1 <= max_tokens <= limits.max_tokens_limit:
        raise _bad(f"max_tokens must be between 1 and {limits.max_tokens_limit}", "max_tokens")
    if math.isnan(temperature) or not 0 <= temperature <= 2:
        raise _bad("temperature must be between 0 and 2", "temperature")
    if draft in ("eb", "adaptive") and temperature > 0:
        raise _bad(f"draft {draft} is greedy only (temperature 0)", "draft")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > 4 or not all(stop):
        raise _bad("stop is up to 4 non-empty strings", "stop")
    return Options(method, block, float(gamma), proxy, draft, max_tokens, float(temperature), req.seed, stop,
                   req.stream)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, text: str, reason: str, use: dict, stats: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}],
            "usage": use, "sbd": stats}


def completion_chunk(rid: str, model: str, text: str, reason: str | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}]}


def chat_body(rid: str, model: str, text: str, reason: str, use: dict, stats: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                         "logprobs": None}],
            "usage": use, "sbd": stats}


def chat_chunk(rid: str, model: str, delta: dict, reason: str | None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}]}
