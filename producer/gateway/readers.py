"""A cap on concurrent requests that hold a reply-stream reader (every
generation request, streamed or not, and every job-events stream): in total
and per tenant, so one tenant's thousand open streams cannot take every Redis
connection and event-loop slot from the others.

A plain ASGI middleware: the count is taken before the route runs and given
back when the response is over (finished, failed or cut off), whatever the
route did, so nothing can leak a slot.
"""
from __future__ import annotations

import hmac
import json
import re
from collections import Counter
from typing import Optional

from inferq.producer.gateway.errors import error_body

# (a response's GET is counted too: it may be a resumed event stream, ?stream=true)
_READER_PATHS = re.compile(r"^/v1/(completions|chat/completions|jobs/[^/]+/events|responses|responses/[^/]+)$")


def _tenant_of(scope) -> Optional[str]:
    """The caller's tenant from its bearer key (None: no key, or unrestricted)."""
    keys = getattr(scope["app"].state, "api_keys", None) or {}
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip().encode()
            for key, principal in keys.items():
                if scheme.lower() == "bearer" and hmac.compare_digest(key.encode(), token):
                    return principal.tenant
    return None


class ReaderLimit:
    def __init__(self, app, total: int, per_tenant: int):
        self.app = app
        self.total = total
        self.per_tenant = per_tenant
        self.open = 0
        self.by_tenant: Counter = Counter()

    async def _reject(self, send, message: str) -> None:
        body = json.dumps(error_body(message, "rate_limit_error", code="too_many_streams")).encode()
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not _READER_PATHS.match(scope.get("path", "")):
            return await self.app(scope, receive, send)
        tenant = _tenant_of(scope)
        if self.open >= self.total:
            return await self._reject(send, f"the gateway already serves {self.total} concurrent streams; "
                                            "retry shortly")
        if tenant is not None and self.by_tenant[tenant] >= self.per_tenant:
            return await self._reject(send, f"tenant {tenant!r} already has {self.per_tenant} concurrent "
                                            "streams open; retry when one ends")
        # One event loop: the check above and these increments cannot interleave.
        self.open += 1
        if tenant is not None:
            self.by_tenant[tenant] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open -= 1
            if tenant is not None:
                self.by_tenant[tenant] -= 1
                if not self.by_tenant[tenant]:
                    del self.by_tenant[tenant]
