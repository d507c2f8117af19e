"""Who may see what on the dashboard.

- An operator key (INFERQ_GATEWAY_DASHBOARD_KEYS) sees everything: queues,
  workers, the DLQ, every tenant's jobs and batches.
- An API key sees what the API shows it: a tenant key its own jobs and batches
  (another tenant's are 404, as on /v1), never the operator views (403).
- With no keys at all the gateway serves only its own machine
  (config.check_exposure), and the dashboard is open there as the API is. An
  exposed gateway without operator keys refuses the operator views.

A browser cannot send a Bearer header on navigation, so /dashboard/login puts
the key in an HttpOnly, SameSite=Strict cookie scoped to /dashboard; scripts
send the Bearer header. Changes (retry, delete, cancel) also need the
X-Inferq-Dashboard header, which a cross-site form cannot send.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Optional

from fastapi import Request

from inferq.producer.gateway.auth import _match
from inferq.producer.gateway.config import Principal, is_exposed
from inferq.producer.gateway.errors import APIError

COOKIE = "inferq_dashboard"
CHANGE_HEADER = "x-inferq-dashboard"


@dataclass(frozen=True)
class Viewer:
    operator: bool
    tenant: Optional[str]

    @property
    def principal(self) -> Principal:
        """The API's rules for jobs and batches."""
        return Principal(tenant=self.tenant)


def _operator_key(keys: frozenset[str], given: str) -> bool:
    found = False
    for key in keys:  # every key: timing does not tell which one matched
        found |= hmac.compare_digest(key.encode(), given.encode())
    return found


def identify(app, token: str) -> Optional[Viewer]:
    """The viewer a key names, or None for an unknown key."""
    if _operator_key(app.state.dashboard_keys, token):
        return Viewer(operator=True, tenant=None)
    principal = _match(app.state.api_keys, token) if app.state.api_keys else None
    if principal is not None:
        return Viewer(operator=False, tenant=principal.tenant)
    return None


def _token(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(COOKIE, "").strip()


def open_access(app) -> bool:
    """No keys of any kind: the gateway serves its own machine only."""
    return not app.state.dashboard_keys and not app.state.api_keys


async def viewer(request: Request) -> Viewer:
    """Any authenticated caller (a FastAPI dependency)."""
    app = request.app
    if request.method not in ("GET", "HEAD") and "authorization" not in request.headers \
            and request.headers.get(CHANGE_HEADER) != "1":
        # Changes without a Bearer header (a cookie, or no keys at all) must come
        # from the dashboard's own script, never from another site's form.
        raise APIError(403, f"changes need the '{CHANGE_HEADER}: 1' header", code="csrf")
    if open_access(app):
        return Viewer(operator=not is_exposed(app.state.ctx.settings), tenant=None)
    token = _token(request)
    if not token:
        raise APIError(401, "missing key: send 'Authorization: Bearer <key>' or log in at /dashboard/login",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    who = identify(app, token)
    if who is None:
        raise APIError(401, "invalid key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return who


async def operator(request: Request) -> Viewer:
    """Operator views: queues, workers, the DLQ, charts."""
    who = await viewer(request)
    if not who.operator:
        raise APIError(403, "this view needs an operator key (INFERQ_GATEWAY_DASHBOARD_KEYS)",
                       code="operator_only")
    return who
