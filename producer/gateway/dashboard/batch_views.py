"""Batch API batches with progress, and cancel: the Batch API's own routes,
called with the viewer's tenant (an operator sees every tenant's)."""
from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, Query, Request

from inferq.producer.gateway import batch_routes
from inferq.producer.gateway.dashboard.access import Viewer, viewer

router = APIRouter()


@router.get("/dashboard/api/batches")
async def batches(request: Request, after: Optional[str] = None, limit: int = Query(20, ge=1, le=100),
                  who: Viewer = Depends(viewer)):
    return await batch_routes.list_batches(request, after=after, limit=limit, principal=who.principal)


@router.post("/dashboard/api/batches/{batch_id}/cancel")
async def cancel(batch_id: str, request: Request, who: Viewer = Depends(viewer)):
    return await batch_routes.cancel_batch(batch_id, request, principal=who.principal)
