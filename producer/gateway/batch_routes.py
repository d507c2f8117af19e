"""OpenAI Batch API routes: create, retrieve, list, cancel. The work happens in
batch_driver; these only read and write the batch record (batch_store)."""
from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from inferq.producer.gateway.auth import authenticate, can_access
from inferq.producer.gateway.batch_lines import ENDPOINTS
from inferq.producer.gateway.batch_store import FINAL, batch_object, new_batch_id
from inferq.producer.gateway.config import Principal
from inferq.producer.gateway.errors import APIError, bad_request
from inferq.producer.gateway.files_routes import owned_file

router = APIRouter()

WINDOWS = {"24h": 24 * 3600}


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input_file_id: str = Field(min_length=1, max_length=128)
    endpoint: str
    completion_window: str
    metadata: Optional[dict[str, str]] = Field(None, max_length=16)


def _svc(request: Request):
    return request.app.state.batch


async def _owned_batch(request: Request, principal: Principal, batch_id: str) -> dict:
    rec = await _svc(request).store.get(batch_id) if batch_id.startswith("batch_") else None
    if rec is None or not can_access(principal, rec.get("tenant") or None):
        raise APIError(404, f"No such Batch object: {batch_id}", code="batch_not_found")
    return rec


@router.post("/v1/batches")
async def create_batch(req: BatchCreate, request: Request, principal: Principal = Depends(authenticate)):
    if req.endpoint not in ENDPOINTS:
        raise bad_request(f"endpoint {req.endpoint!r} is not supported; use one of: {', '.join(ENDPOINTS)}",
                          param="endpoint")
    if req.completion_window not in WINDOWS:
        raise bad_request(f"completion_window must be one of: {', '.join(WINDOWS)}", param="completion_window")
    for k, v in (req.metadata or {}).items():
        if len(k) > 64 or len(v) > 512:
            raise bad_request("metadata keys are at most 64 characters and values at most 512", param="metadata")
    meta = owned_file(request, principal, req.input_file_id)
    if meta["purpose"] != "batch":
        raise bad_request(f"file {req.input_file_id} has purpose {meta['purpose']!r}, not 'batch'",
                          param="input_file_id")
    svc = _svc(request)
    rec = await svc.store.create(new_batch_id(), endpoint=req.endpoint, input_file_id=req.input_file_id,
                                 completion_window=req.completion_window, metadata=req.metadata,
                                 tenant=principal.tenant, expires_in_s=WINDOWS[req.completion_window])
    await svc.manager.kick(rec["id"])
    return batch_object(rec)


@router.get("/v1/batches")
async def list_batches(request: Request, after: Optional[str] = None, limit: int = Query(20, ge=1, le=100),
                       principal: Principal = Depends(authenticate)):
    store = _svc(request).store
    out: list[dict] = []
    passed = after is None
    has_more = False
    for batch_id in await store.ids(newest_first=True):
        if not passed:
            passed = batch_id == after
            continue
        rec = await store.get(batch_id)
        if rec is None or not can_access(principal, rec.get("tenant") or None):
            continue
        if len(out) == limit:
            has_more = True
            break
        out.append(batch_object(rec))
    return {"object": "list", "data": out, "first_id": out[0]["id"] if out else None,
            "last_id": out[-1]["id"] if out else None, "has_more": has_more}


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, request: Request, principal: Principal = Depends(authenticate)):
    return batch_object(await _owned_batch(request, principal, batch_id))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request, principal: Principal = Depends(authenticate)):
    rec = await _owned_batch(request, principal, batch_id)
    store = _svc(request).store
    found = await store.transition(batch_id, ("validating", "in_progress"), "cancelling")
    if found in FINAL:
        raise APIError(409, f"batch {batch_id} is already {found}; it cannot be cancelled", code="batch_final")
    return batch_object(await store.get(batch_id) or rec)
