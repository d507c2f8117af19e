"""A job's page: its record, its events as a timeline, attempts and workers, its text."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from inferq.schemas import keys
from inferq.producer.gateway.auth import can_access
from inferq.producer.gateway.dashboard.access import Viewer, viewer
from inferq.producer.gateway.dashboard import timeline
from inferq.producer.gateway.errors import APIError
from inferq.producer.gateway.runner import ctx_of

router = APIRouter()


@router.get("/dashboard/api/jobs/{job_id}")
async def job(job_id: str, request: Request, who: Viewer = Depends(viewer)):
    ctx = ctx_of(request)
    info = await ctx.backend.info(job_id)
    # Another tenant's job is as absent as a job that never was (no leaking ids).
    if info is None or not can_access(who.principal, info.get("tenant") or None):
        raise APIError(404, f"job '{job_id}' not found", code="job_not_found")
    # Reply streams are bounded (INFERQ_REPLY_MAXLEN), so one read is bounded too.
    entries = await ctx.backend.redis.xrange(keys.reply(job_id))
    view = timeline.build(entries)
    return {"id": job_id, "object": "dashboard.job", "status": info.get("status"), "model": info.get("model"),
            "tenant": info.get("tenant"), "attempt": info.get("attempt"), "worker": info.get("worker"),
            "created_at": info.get("created_at"), "started_at": info.get("started_at"),
            "finished_at": info.get("finished_at"), **view}
