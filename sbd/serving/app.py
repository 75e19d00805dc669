"""`sbd serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the per-row engine.

Endpoints: POST /v1/completions and /v1/chat/completions (streaming by server-sent events with
`"stream": true`), GET /v1/models, /health and /metrics (Prometheus). Every answer equals what
`sbd.generate` gives offline for the same prompt and options: the server decodes each request as a row
of one engine (`sbd.serving.worker`), and a row's tokens never depend on its neighbours.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..decoding.generate import apply_chat, check_prompt_ids, context_limit, default_block_size, default_eos_ids
from ..decoding.rows import make_row
from ..decoding.width_cost import forward_costs
from ..errors import SBDError
from . import protocol as P
from .metrics import Metrics
from .worker import Job, Worker


@dataclass
class ServerConfig:
    """How the server runs: the name clients use for the model, the engine's rows and queue, limits."""

    model_name: str = "sbd"
    max_batch: int = 8
    max_queue: int = 64
    max_model_len: int = 2048  # cache positions per request: prompt + max_tokens + scratch
    prefill: str = "separate"
    limits: P.Limits | None = None


class Server:
    """The model, its tokenizer and the worker; what the endpoints share."""

    def __init__(self, model, tokenizer, config: ServerConfig):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.limits = config.limits or P.Limits()
        self.default_block = default_block_size(model)
        self.eos = default_eos_ids(model, tokenizer)
        self.mask_id = getattr(model.config, "sbd_mask_token_id", None)
        self.device = model.get_input_embeddings().weight.device
        self.metrics = Metrics()
        # adaptive drafting trades acceptance against the cost of a wider forward, timed once here at the
        # engine's full batch (the load the server is sized for)
        self.forward_cost = forward_costs(model, batch=config.max_batch)
        width = 2 * max(self.limits.block_size_limit, self.default_block) + 1
        limit = context_limit(model)  # prompt + max_tokens never run past the model's positions
        self.max_len = min(config.max_model_len, limit) if limit else config.max_model_len
        self.worker = Worker(model, slots=config.max_batch, capacity=self.max_len + width, max_width=width,
                             max_queue=config.max_queue, metrics=self.metrics, prefill=config.prefill)

    def job(self, prompt_ids: list[int], opts: P.Options) -> Job:
        if opts.method != "ntp" and self.mask_id is None:
            raise P.APIError(400, "this model has no SBD mask token; use method ntp", param="method")
        if len(prompt_ids) + opts.max_tokens > self.max_len:
            raise P.APIError(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({opts.max_tokens}) exceeds "
                                  f"this server's {self.max_len} tokens per request", param="max_tokens",
                             code="context_length_exceeded")
        try:
            check_prompt_ids(self.model, self.tokenizer, [prompt_ids])
        except SBDError as e:
            raise P.APIError(400, str(e), param="prompt") from None
        row = make_row(opts.method, prompt_ids, mask_id=self.mask_id, block_size=opts.block_size, gamma=opts.gamma,
                       proxy=opts.proxy, draft=opts.draft, max_new=opts.max_tokens, eos=self.eos, stop=opts.stop,
                       tokenizer=self.tokenizer, temperature=opts.temperature, seed=opts.seed, device=self.device,
                       cost=self.forward_cost)
        return Job(row, opts.method, asyncio.get_running_loop())


def _text(tokenizer, tokens: list[int], stop: list[str]) -> tuple[str, bool]:
    """The text of `tokens` cut before the first stop string, and whether one was found."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    cut = [text.index(s) for s in stop if s in text]
    return (text[: min(cut)], True) if cut else (text, False)


def _safe_prefix(text: str, stop: list[str]) -> str:
    """The part of `text` that can be sent now: not an unfinished character, nor the start of a stop string."""
    hold = max((len(s) - 1 for s in stop), default=0)
    for n in range(hold, 0, -1):  # the longest tail that begins some stop string
        if any(s.startswith(text[-n:]) for s in stop):
            text = text[:-n]
            break
    return text.rstrip("\ufffd")


def create_app(model, tokenizer, config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving `model`; the engine thread starts and stops with the app's lifespan."""
    server = Server(model, tokenizer, config or ServerConfig())

    @asynccontextmanager
    async def lifespan(app):
        server.worker.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, server.worker.stop)  # drain, then stop

    app = FastAPI(title="sbd", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(P.APIError)
    async def api_error(request: Request, exc: P.APIError):
        server.metrics.requests.labels(request.url.path, str(exc.status)).inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            err = P.APIError(400, "the body is not valid JSON")
        else:
            where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
            err = P.APIError(400, f"invalid request: {first.get('msg', 'malformed body')}" +
                             (f" ({where})" if where else ""), param=where)
        return await api_error(request, err)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception):
        return await api_error(request, P.APIError(500, f"internal error: {exc}", type_="server_error"))

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": server.worker.engine.live, "queued": len(server.worker.pending)}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.config.model_name, "object": "model", "created": 0,
                                            "owned_by": "sbd"}]}

    def check_model(name: str | None) -> None:
        if name is not None and name != server.config.model_name:
            raise P.APIError(404, f"model {name!r} is not served here; this server serves {server.config.model_name!r}",
                             param="model", code="model_not_found")

    @app.post("/v1/completions")
    async def completions(body: P.CompletionRequest, request: Request):
        check_model(body.model)
        opts = P.options(body, server.limits, server.default_block)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise P.APIError(400, "one prompt per request (a list of one string, or token ids)", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            if tokenizer is None:
                raise P.APIError(400, "this model has no tokenizer; send token ids", param="prompt")
            ids = tokenizer(prompt).input_ids
        else:
            ids = list(prompt)
        if not ids:
            raise P.APIError(400, "the prompt is empty", param="prompt")
        return await _answer(server, request, "/v1/completions", ids, opts, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: P.ChatRequest, request: Request):
        check_model(body.model)
        opts = P.options(body, server.limits, server.default_block)
        if not body.messages:
            raise P.APIError(400, "messages is empty", param="messages")
        try:
            ids = apply_chat(tokenizer, [m.model_dump() for m in body.messages])
        except SBDError as e:
            raise P.APIError(400, str(e), param="messages") from None
        except Exception as e:  # a template that refuses the conversation (e.g. roles out of order)
            raise P.APIError(400, f"the chat template refused these messages: {e}", param="messages") from None
        return await _answer(server, request, "/v1/chat/completions", ids, opts, chat=True)

    return app


async def _answer(server: Server, request: Request, path: str, ids: list[int], opts: P.Options, chat: bool):
    job = server.job(ids, opts)
    server.worker.submit(job)
    rid = P.new_id("chatcmpl" if chat else "cmpl")
    name = server.config.model_name
    if opts.stream:
        server.metrics.requests.labels(path, "200").inc()
        return StreamingResponse(_stream(server, request, job, rid, name, opts, chat), media_type="text/event-stream")
    tokens = []
    try:
        async for kind, payload in _events(server, request, job):
            if kind == "tokens":
                tokens += payload
            elif kind == "error":
                raise P.APIError(500, payload, type_="server_error")
    finally:
        if not job.row.finished:  # the client went away, or an error: free the row
            server.worker.cancel(job)
    if not job.row.finished:
        return JSONResponse({}, status_code=499)  # nobody is listening
    text, _ = _text(server.tokenizer, tokens, opts.stop) if server.tokenizer is not None else ("", False)
    row = job.row
    stats = _stats(row, opts)
    use = P.usage(len(ids), len(row.out))
    server.metrics.requests.labels(path, "200").inc()
    body = (P.chat_body if chat else P.completion_body)(rid, name, text, row.finish_reason, use, stats)
    return JSONResponse(body)


def _stats(row, opts: P.Options) -> dict:
    """What the request cost: sbd's own field next to OpenAI's usage."""
    return {"method": opts.method, "forwards": row.nfe,
            "tokens_per_forward": round(len(row.out) / row.nfe, 4) if row.nfe else 0.0}


async def _events(server: Server, request: Request, job: Job):
    """The job's events until it is done; stops early (without "done") when the client disconnects."""
    while True:
        try:
            kind, payload = await asyncio.wait_for(job.events.get(), timeout=0.5)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return
            continue
        yield kind, payload
        if kind in ("done", "error"):
            return


async def _stream(server: Server, request: Request, job: Job, rid: str, name: str, opts: P.Options, chat: bool):
    def event(obj) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    def chunk(text: str, reason: str | None = None) -> str:
        if chat:
            return event(P.chat_chunk(rid, name, {"content": text} if text or reason is None else {}, reason))
        return event(P.completion_chunk(rid, name, text, reason))

    tokens, sent = [], ""
    try:
        if chat:
            yield event(P.chat_chunk(rid, name, {"role": "assistant", "content": ""}, None))
        async for kind, payload in _events(server, request, job):
            if kind == "error":
                yield event(P.APIError(500, payload, type_="server_error").body())
                return
            if kind == "tokens":
                tokens += payload
                text, found = _text(server.tokenizer, tokens, opts.stop)
                ready = text if found else _safe_prefix(text, opts.stop)
                if len(ready) > len(sent) and ready.startswith(sent):
                    yield chunk(ready[len(sent):])
                    sent = ready
                continue
            text, _ = _text(server.tokenizer, job.row.out, opts.stop)
            if len(text) > len(sent) and text.startswith(sent):
                yield chunk(text[len(sent):])
            last = json.loads(chunk("", job.row.finish_reason)[6:])
            last["usage"] = P.usage(len(job.row.prompt), len(job.row.out))  # on the last chunk, always
            last["sbd"] = _stats(job.row, opts)
            yield event(last)
            yield "data: [DONE]\n\n"
            return
    except asyncio.CancelledError:  # the client disconnected mid-stream: free its row
        server.worker.cancel(job)
        raise
    finally:
        if not job.row.finished:
            server.worker.cancel(job)
