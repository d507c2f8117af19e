"""The operator dashboard: /dashboard (HTML) and /dashboard/api/* (JSON, for
scripts too). docs/dashboard.md lists the routes, their answers and who may
call them."""
from __future__ import annotations

from fastapi import APIRouter

from inferq.producer.gateway.dashboard import batch_views, dlq_views, job_view, pages, queue_views, webhook_views

PARTS = (pages, queue_views, job_view, dlq_views, batch_views, webhook_views)
router = APIRouter(tags=["dashboard"])
for _part in PARTS:
    router.include_router(_part.router)
