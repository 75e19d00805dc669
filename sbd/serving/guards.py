"""What stands before the app (ASGI middleware): the API key, and the request-body size limit.

Both answer in OpenAI's error shape before the app runs: 401 without the right `Authorization: Bearer`
key (every route but /health), 413 for a body larger than the limit (told by Content-Length, or
counted while it arrives), without reading more of it.
"""

from __future__ import annotations

import hmac
from typing import Callable

from .errors import APIError

OPEN_PATHS = ("/health",)


async def _answer(send, err: APIError) -> None:
    status, headers, body = err.raw()
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class APIKey:
    """401 unless the request carries `Authorization: Bearer <key>` (the scheme in any case); /health stays
    open."""

    def __init__(self, app, key: str, count: Callable[[str, int], None] = lambda path, status: None):
        self.app, self.key, self.count = app, key.encode(), count

    def _matches(self, given: bytes) -> bool:
        """`Bearer <key>`, the scheme in any case (RFC 7235: auth schemes are case-insensitive)."""
        scheme, _, token = given.strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not self._matches(given):
            self.count(scope["path"], 401)
            what = "no API key given" if not given else "incorrect API key"
            return await _answer(send, APIError(401, f"{what}: send the header Authorization: Bearer <key>",
                                                type_="authentication_error", code="invalid_api_key"))
        return await self.app(scope, receive, send)


class BodyLimit:
    """413 for a body over `max_bytes`; the body is read once and handed on. `after(size)` runs when a
    request is answered (the server frees memory after large ones)."""

    def __init__(self, app, max_bytes: int, count: Callable[[str, int], None] = lambda path, status: None,
                 after: Callable[[int], None] = lambda size: None):
        self.app, self.max_bytes, self.count, self.after = app, max_bytes, count, after

    def _too_large(self, path: str) -> APIError:
        self.count(path, 413)
        return APIError(413, f"the request body exceeds this server's limit of {self.max_bytes} bytes",
                        param=None, code="request_too_large")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await _answer(send, self._too_large(scope["path"]))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await _answer(send, self._too_large(scope["path"]))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        del chunks
        replayed = False

        async def replay():
            nonlocal replayed, body
            if not replayed:
                replayed = True
                message, body = {"type": "http.request", "body": body, "more_body": False}, b""
                return message
            return await receive()

        try:
            await self.app(scope, replay, send)
        finally:
            self.after(size)
