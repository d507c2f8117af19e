"""Bearer API keys, optionally mapped to tenants.

Keys are compared in constant time; a missing or wrong key is a 401 in
OpenAI's shape. With no keys configured every caller is unrestricted.
"""
from __future__ import annotations

import hmac

from fastapi import Request

from inferq.producer.gateway.config import Principal
from inferq.producer.gateway.errors import APIError

UNRESTRICTED = Principal(tenant=None)


def _match(keys: dict[str, Principal], given: str) -> Principal | None:
    found = None
    for key, principal in keys.items():
        # Check every key so timing does not tell which prefix matched.
        if hmac.compare_digest(key.encode(), given.encode()):
            found = principal
    return found


async def authenticate(request: Request) -> Principal:
    keys: dict[str, Principal] = request.app.state.api_keys
    if not keys:
        return UNRESTRICTED
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})
    principal = _match(keys, token.strip())
    if principal is None:
        raise APIError(401, "invalid API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return principal


def can_access(principal: Principal, job_tenant: str | None) -> bool:
    """A tenant sees only its own jobs; an unrestricted caller sees all."""
    return principal.tenant is None or principal.tenant == job_tenant
