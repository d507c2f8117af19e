"""/v1/webhook_endpoints: a tenant registers, lists, reads, re-keys and deletes
its webhook endpoints, in the wire format of OpenAI's webhook endpoints API (so
``client.webhooks.create(...)`` of the official SDK works against the gateway).

A caller sees only its tenant's endpoints (another tenant's id is a 404); a
caller without a tenant (no API keys, or a key without one) manages the
endpoints of jobs without a tenant and sees every endpoint. The signing secret
is shown once: in the answer to the create or rotate call. Endpoints the
operator configured (INFERQ_GATEWAY_WEBHOOKS) are listed but changed only there.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from inferq.producer.gateway.auth import authenticate, can_access
from inferq.producer.gateway.config import Principal
from inferq.producer.gateway.errors import APIError, bad_request
from inferq.producer.gateway.webhooks.endpoints import (Endpoint, EndpointStore, check_events, check_url,
                                                        new_secret)

router = APIRouter()


class CreateEndpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    event_types: Optional[list[str]] = None  # absent: every event type
    name: str = Field("", max_length=256)


def _service(request: Request):
    svc = getattr(request.app.state, "webhooks", None)
    if svc is None:
        raise APIError(404, "webhooks are turned off on this gateway (INFERQ_GATEWAY_WEBHOOKS_ENABLED=false)",
                       code="webhooks_disabled")
    return svc


async def _owned(store: EndpointStore, principal: Principal, endpoint_id: str) -> Endpoint:
    ep = (await store.all(fresh=True)).get(endpoint_id)
    if ep is None or not can_access(principal, ep.tenant or None):
        raise APIError(404, f"webhook endpoint '{endpoint_id}' not found", code="webhook_endpoint_not_found")
    return ep


def _api_only(ep: Endpoint) -> None:
    if ep.source != "api":
        raise APIError(403, f"webhook endpoint '{ep.id}' is configured by the operator (INFERQ_GATEWAY_WEBHOOKS)",
                       code="webhook_endpoint_configured")


@router.post("/v1/webhook_endpoints")
async def create_endpoint(req: CreateEndpoint, request: Request, principal: Principal = Depends(authenticate)):
    svc = _service(request)
    try:
        url = check_url(req.url, allow_http=svc.settings.webhook_allow_http)
        events = check_events(req.event_types)
    except ValueError as e:
        raise bad_request(str(e), param="url" if "url" in str(e) else "event_types") from None
    tenant = principal.tenant or ""
    if len(await svc.endpoints.of_tenant(tenant)) >= svc.settings.webhook_max_endpoints:
        raise bad_request(f"a tenant has at most {svc.settings.webhook_max_endpoints} webhook endpoints",
                          code="too_many_webhook_endpoints")
    ep = await svc.endpoints.create(tenant, url, events, req.name)
    return ep.public(with_secret=True)


@router.get("/v1/webhook_endpoints")
async def list_endpoints(request: Request, principal: Principal = Depends(authenticate),
                         limit: int = Query(20, ge=1, le=100), after: Optional[str] = None):
    svc = _service(request)
    found = await svc.endpoints.of_tenant(principal.tenant)
    if after is not None:
        ids = [e.id for e in found]
        found = found[ids.index(after) + 1:] if after in ids else []
    page = found[:limit]
    return {"object": "list", "data": [e.public() for e in page], "has_more": len(found) > limit,
            "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None}


@router.get("/v1/webhook_endpoints/{endpoint_id}")
async def get_endpoint(endpoint_id: str, request: Request, principal: Principal = Depends(authenticate)):
    return (await _owned(_service(request).endpoints, principal, endpoint_id)).public()


@router.delete("/v1/webhook_endpoints/{endpoint_id}")
async def delete_endpoint(endpoint_id: str, request: Request, principal: Principal = Depends(authenticate)):
    store = _service(request).endpoints
    ep = await _owned(store, principal, endpoint_id)
    _api_only(ep)
    await store.delete(ep.id)
    return {"id": ep.id, "object": "webhook_endpoint.deleted", "deleted": True}


@router.post("/v1/webhook_endpoints/{endpoint_id}/rotate_secret")
async def rotate_secret(endpoint_id: str, request: Request, principal: Principal = Depends(authenticate)):
    """A new secret at once: deliveries from now on (retries included) are signed with it."""
    store = _service(request).endpoints
    ep = await _owned(store, principal, endpoint_id)
    _api_only(ep)
    ep = dataclasses.replace(ep, secret=new_secret(), updated_at=int(time.time()))
    await store.replace(ep)
    return ep.public(with_secret=True)
