"""`sbd serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the per-row engine.

Endpoints: POST /v1/completions and /v1/chat/completions (streaming by server-sent events with
`"stream": true`), GET /v1/models, /health and /metrics (Prometheus). Every answer equals what
`sbd.generate` gives offline for the same prompt and options: the server decodes each request as rows
of one engine (`sbd.serving.worker`), and a row's tokens never depend on its neighbours.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import ValidationError

from . import errors
from . import protocol as P
from .config import ServerConfig
from .errors import APIError, validation_error
from .guards import APIKey, BodyLimit
from .memory import Releaser
from .replies import answer
from .server import Server

__all__ = ["ServerConfig", "create_app"]


def create_app(model, tokenizer, config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving `model`; the engine thread starts and stops with the app's lifespan."""
    server = Server(model, tokenizer, config or ServerConfig())
    # the model card names them, as the server read them once: the format ("int4, exactly as stored" where a
    # file's own numbers are held), else the dtype
    weights = server.facts.held

    @asynccontextmanager
    async def lifespan(app):
        server.worker.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, server.worker.stop)  # drain, then stop
        server.pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="sbd", lifespan=lifespan)
    app.state.server = server
    errors.install(app, server.count)
    app.add_middleware(BodyLimit, max_bytes=server.config.max_body_bytes, count=server.count,
                       after=Releaser().after)
    if server.config.api_key:  # added last: runs first, before the body is read
        app.add_middleware(APIKey, key=server.config.api_key, count=server.count)

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": server.worker.engine.live, "queued": len(server.worker.pending)}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.config.model_name, "object": "model", "created": 0,
                                            "owned_by": "sbd", "weights": weights}]}

    def check_model(name: str | None) -> None:
        """`model` left out (None) is the served model, as vLLM's OpenAI server takes it; any other name, ""
        included, is a 404 (docs/serving.md)."""
        if name is not None and name != server.config.model_name:
            raise APIError(404, f"model {name!r} is not served here; this server serves {server.config.model_name!r}",
                           param="model", code="model_not_found")

    def checked(body) -> P.Options:
        check_model(body.model)
        return P.options(body, server.limits, server.facts, server.defaults)

    async def parsed(request: Request, kind):
        """The body as `kind`, parsed and validated in the tokenizing pool: a large JSON body never holds
        up the event loop (and with it /health and every other client)."""
        raw = await request.body()
        if not raw.strip():
            raise APIError(400, "the body is empty; send a JSON object")
        try:
            return await server._off_loop(lambda: kind.model_validate(json.loads(raw)))
        except RecursionError:
            raise APIError(400, "the body is not valid JSON (nested too deeply)") from None
        except ValueError as e:  # json.loads keeps lone surrogates, so the protocol can name their field
            if not isinstance(e, ValidationError):
                raise APIError(400, "the body is not valid JSON") from None
            # the same 400 as FastAPI's own parsing gave, the field named as "body.…"
            raise validation_error([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parsed(request, P.CompletionRequest)
        opts = checked(body)
        prompt = P.prompt_of(body)
        ids = await server.encode(prompt) if isinstance(prompt, str) else server.check_length(prompt, "prompt")
        echo = ""
        if opts.echo:
            echo = prompt if isinstance(prompt, str) else (
                tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else "")
        del body, prompt  # a long prompt's text is not kept while it decodes
        return await answer(server, request, "/v1/completions", ids, opts, chat=False, echo=echo)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await parsed(request, P.ChatRequest)
        opts = checked(body)
        ids = await server.encode_chat(P.messages_of(body))
        del body
        return await answer(server, request, "/v1/chat/completions", ids, opts, chat=True)

    return app
