"""Webhook deliveries: the latest attempts, the dead letters with their last
error, and the outbox's depth (producer/gateway/webhooks). Operators only: the
rows name every tenant's endpoints."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from inferq.producer.gateway.dashboard.access import Viewer, operator

router = APIRouter()


@router.get("/dashboard/api/webhooks")
async def webhooks(request: Request, limit: int = Query(50, ge=1, le=200), who: Viewer = Depends(operator)):
    svc = getattr(request.app.state, "webhooks", None)
    if svc is None:
        return {"enabled": False, "recent": [], "dead": [], "pending": 0, "dead_total": 0, "backlog": 0}
    depths = await svc.outbox.depths()
    return {"enabled": True, "recent": await svc.outbox.recent(limit), "dead": await svc.outbox.dead(limit),
            "pending": depths["pending"], "dead_total": depths["dead"], "backlog": depths["backlog"]}
