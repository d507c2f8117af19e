"""Request body size limit as a plain ASGI middleware.

It checks Content-Length up front and also counts streamed bytes, so a client
that lies about (or omits) the length cannot push more than the limit.
"""
from __future__ import annotations

import json

from producer.gateway.errors import error_body


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send) -> None:
        body = json.dumps(error_body(
            f"request body exceeds the gateway's limit of {self.max_bytes} bytes",
            "invalid_request_error", code="request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    if int(value) > self.max_bytes:
                        return await self._reject(send)
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
                if seen > self.max_bytes:
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
                    await self._reject(send)
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not replaced:
                await self._reject(send)
