"""Request body size limit as a plain ASGI middleware.

It checks Content-Length up front and also counts streamed bytes, so a client
that lies about (or omits) the length cannot push more than the limit.
"""
from __future__ import annotations

import json

from inferq.producer.gateway.errors import error_body


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app, max_bytes: int, overrides: dict[str, int] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.overrides = overrides or {}  # path -> its own limit (file uploads)

    async def _reject(self, send, limit: int) -> None:
        body = json.dumps(error_body(
            f"request body exceeds the gateway's limit of {limit} bytes",
            "invalid_request_error", code="request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.overrides.get(scope.get("path", ""), self.max_bytes)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    if int(value) > limit:
                        return await self._reject(send, limit)
                except ValueError:
                    pass
        seen = 0
        too_large = False
        replaced = False

        async def limited_receive():
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    too_large = True
                    raise _TooLarge()
            return message

        async def guarded_send(message):
            # Whatever the app makes of the aborted read (a 400 or 500),
            # the client gets the 413 that explains it.
            nonlocal replaced
            if too_large:
                if not replaced:
                    replaced = True
                    await self._reject(send, limit)
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not replaced:
                await self._reject(send, limit)
