"""The request checks `sbd serve --engine vllm` adds to vLLM's OpenAI server (its `--middleware` option),
so that vLLM refuses with a 400 what sbd's own server refuses, in the same words and the same shape
(OpenAI's `{"error": {"message", "type", "param", "code"}}`, `sbd.serving.errors`):

- a field neither OpenAI's API nor vLLM's server knows (`foo`, a typo such as `max_token`): vLLM would log
  it and go on; sbd's server says "unrecognized request argument supplied: max_token";
- a field of sbd's own engine (`method`, `block_size`, `gamma`, `proxy`, `anchor`, `draft`, `lookup`,
  `lookup_max`, `tree`): the vLLM engine decodes sbd-verify only, with the plug-in's drafting, so such a
  field would be dropped; `method: "sbd-verify"` and `anchor: false`, which ask what it does, pass;
- the SBD mask token in a prompt or a message, as text or as a token id: reserved for decoding;
- a model name other than the one served: 404, `code: model_not_found` (`""` too, as sbd's server refuses
  it; vLLM alone would serve it). `model` left out or null is the served model, as vLLM takes it
  (`BaseServing._is_model_supported`, vllm/entrypoints/serve/engine/serving.py:86 in 0.32) and sbd's server.

vLLM's own validation runs after these. Only POST /v1/completions and /v1/chat/completions bodies that
parse as a JSON object are checked; with an API key, only requests that carry it (the others reach vLLM's
own 401). Runs in vLLM's API-server process; its settings come from the environment
(`launch.server_environment`: SBD_VLLM_REQUESTS).
"""

from __future__ import annotations

import json
import os

from ...serving.errors import APIError

PATHS = ("/v1/completions", "/v1/chat/completions")
SBD_FIELDS = ("method", "block_size", "gamma", "proxy", "anchor", "draft", "lookup", "lookup_max", "tree")
NO_OPS = {"method": ("sbd-verify",), "anchor": (False,)}  # what asks for what the vLLM engine does anyway


def bad(message: str, param: str | None) -> APIError:
    return APIError(400, message, param=param)


def known_fields(path: str) -> set[str] | None:
    """The fields vLLM's request model of `path` reads (None: vLLM is not importable here)."""
    try:
        if path == "/v1/completions":
            from vllm.entrypoints.openai.completion.protocol import CompletionRequest as Request
        else:
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as Request
    except ImportError:
        return None
    return set(Request.model_fields) | {f.alias for f in Request.model_fields.values() if f.alias}


def check(path: str, body: dict, settings: dict, known: set[str] | None) -> APIError | None:
    """The first thing sbd's server would refuse in `body` (a request to `path`), or None."""
    if known is not None:
        for name in body:
            if name not in known and name not in SBD_FIELDS:
                return bad(f"unrecognized request argument supplied: {name}", name)
    served, model = settings.get("served_name"), body.get("model")
    if served is not None and model is not None and model != served:
        return APIError(404, f"model {model!r} is not served here; this server serves {served!r}", param="model",
                        code="model_not_found")
    for name in SBD_FIELDS:
        value = body.get(name)
        if value is not None and value not in NO_OPS.get(name, ()):
            return bad(f"{name} is a setting of sbd's own engine (sbd serve --engine sbd); the vLLM engine decodes "
                       "sbd-verify only, with the plug-in's drafting settings: leave it out", name)
    mask_id, mask_text = settings.get("mask_id"), settings.get("mask_text")
    if mask_id is None:
        return None
    shown = repr(mask_text) if mask_text else f"id {mask_id}"

    def holds(value) -> bool:
        if isinstance(value, str):
            return bool(mask_text) and mask_text in value
        if isinstance(value, list):
            return any(v == mask_id if isinstance(v, int) and not isinstance(v, bool) else holds(v) for v in value)
        return False

    if path == "/v1/completions" and holds(body.get("prompt")):
        return bad(f"the prompt contains the SBD mask token {shown}; it is reserved for decoding and cannot appear "
                   "in a prompt", "prompt")
    messages = body.get("messages")
    for j, m in enumerate(messages if path == "/v1/chat/completions" and isinstance(messages, list) else []):
        content = m.get("content") if isinstance(m, dict) else None
        parts = [content] if isinstance(content, str) else [
            p.get("text") for p in content if isinstance(p, dict)] if isinstance(content, list) else []
        if any(holds(p) for p in parts):
            where = f"messages[{j}].content"
            return bad(f"{where} contains the SBD mask token {shown}; it is reserved for decoding and cannot "
                       "appear in a message", where)
    return None


class RequestChecks:
    """A pure ASGI middleware (vLLM's `--middleware sbd.integrations.vllm.request_checks.RequestChecks`):
    reads the body of a POST to /v1/completions or /v1/chat/completions, answers a refused one itself and
    hands the others on with their body replayed (later messages, a disconnect, still reach vLLM)."""

    def __init__(self, app):
        self.app = app
        self.settings = json.loads(os.environ.get("SBD_VLLM_REQUESTS") or "{}")
        self.key = os.environ.get("VLLM_API_KEY") or None
        self.known: dict[str, set[str] | None] = {}

    def _authorized(self, scope) -> bool:
        if self.key is None:
            return True
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and token.strip() == self.key
        return False

    async def __call__(self, scope, receive, send):
        path = scope.get("path")
        if scope["type"] != "http" or scope.get("method") != "POST" or path not in PATHS or not self._authorized(scope):
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body arrived
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None  # vLLM's own parser answers it
        error = None
        if isinstance(body, dict):
            if path not in self.known:
                self.known[path] = known_fields(path)
            error = check(path, body, self.settings, self.known[path])
        if error is not None:
            status, headers, content = error.raw()
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": content})
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
