"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, for every way a request can
fail: our own checks (`APIError`), FastAPI's body validation, unknown routes and methods, crashes."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("sbd.serve")

_TYPES = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error",
          429: "rate_limit_error"}


class APIError(Exception):
    """An error returned to the client as OpenAI's {"error": {...}} body with an HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)

    def raw(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Status, headers and body for an ASGI middleware that answers before the app runs."""
        body = json.dumps(self.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if self.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        return self.status, headers, body


def _param(loc) -> str | None:
    """`("body", "messages", 0, "role")` → `messages[0].role`."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def validation_error(errors: list[dict]) -> APIError:
    """FastAPI's body validation error as one 400 naming the first bad field."""
    first = errors[0] if errors else {}
    kind, param = first.get("type"), _param(first.get("loc", ()))
    if kind == "json_invalid":
        return APIError(400, "the body is not valid JSON")
    if kind == "missing" and param is None:
        return APIError(400, "the body is empty; send a JSON object")
    if kind == "extra_forbidden":
        return APIError(400, f"unrecognized request argument supplied: {param}", param=param)
    if kind == "missing":
        return APIError(400, f"missing required field: {param}", param=param)
    return APIError(400, f"invalid value for {param}: {first.get('msg', 'malformed')}" if param else
                    f"invalid request: {first.get('msg', 'malformed body')}", param=param)


def install(app: FastAPI, count) -> None:
    """Answer every error in OpenAI's shape; `count(path, status)` counts it."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        count(request.url.path, exc.status)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError):
        return await api_error(request, validation_error(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 404:
            err = APIError(404, f"no route {request.url.path}; see GET /v1/models, POST /v1/completions, "
                                "POST /v1/chat/completions, GET /health, GET /metrics", type_="not_found_error",
                           code="unknown_url")
        elif exc.status_code == 405:
            err = APIError(405, f"method {request.method} is not allowed on {request.url.path}",
                           code="method_not_allowed")
        else:
            err = APIError(exc.status_code, str(exc.detail), type_=_TYPES.get(exc.status_code,
                                                                              "invalid_request_error"))
        return await api_error(request, err)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception):
        log.exception("request failed")
        return await api_error(request, APIError(500, f"internal error: {exc}", type_="server_error"))
