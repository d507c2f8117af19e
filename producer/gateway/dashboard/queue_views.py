"""Operator views of the queue: models and lanes, workers, the charts' series."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import anyio
from fastapi import APIRouter, Depends, Query, Request

from inferq.schemas.connection import sync_client
from inferq.producer.queue_stats import live_workers, model_stats
from inferq.producer.gateway.dashboard.access import Viewer, operator
from inferq.producer.gateway.runner import ctx_of

router = APIRouter()


@dataclass
class _Heartbeats:
    model: str
    workers: list


def sampler_of(request: Request):
    s = request.app.state.dashboard_sampler
    s.watched()
    return s


@router.get("/dashboard/api/queues")
async def queues(request: Request, model: Optional[str] = None, lane_offset: int = Query(0, ge=0),
                 lane_limit: int = Query(100, ge=1, le=500), who: Viewer = Depends(operator)):
    """Per model: totals, workers by heartbeat, and one page of its lanes (busiest first)."""
    ctx = ctx_of(request)
    sampler_of(request)
    names = [model] if model else await ctx.backend.known_models(max_age_s=10.0)
    settings = ctx.backend.settings

    def read():
        r = sync_client(settings)
        try:
            return [model_stats(r, m, settings.worker_stale_seconds) for m in names]
        finally:
            r.close()

    out = []
    for st in await anyio.to_thread.run_sync(read):
        lanes = sorted(st.lanes, key=lambda ln: (-(ln.waiting + ln.pending), ln.cls, ln.tenant, ln.partition))
        d = st.as_dict()
        d["lanes_total"] = len(lanes)
        d["lanes"] = [asdict(ln) for ln in lanes[lane_offset:lane_offset + lane_limit]]
        d["lane_offset"] = lane_offset
        out.append(d)
    return {"object": "list", "data": out}


@router.get("/dashboard/api/workers")
async def workers(request: Request, who: Viewer = Depends(operator)):
    """Workers by heartbeat, with what their /metrics say (KV usage, preemptions,
    the engine limit that binds) where the gateway is told their metrics URLs."""
    ctx = ctx_of(request)
    sampler = sampler_of(request)
    readings = sampler.worker_readings()
    stale = ctx.backend.settings.worker_stale_seconds
    rows, seen = [], set()
    snaps = list(sampler.ring)
    names = await ctx.backend.known_models(max_age_s=10.0)
    settings = ctx.backend.settings

    def read():  # heartbeats straight from Redis (the samples may be seconds old)
        r = sync_client(settings)
        try:
            return [_Heartbeats(m, live_workers(r, m, stale)) for m in names]
        finally:
            r.close()

    queues = await anyio.to_thread.run_sync(read)
    for q in queues:
        for w in q.workers:
            seen.add(w.name)
            rows.append({"model": q.model, "name": w.name, "last_heartbeat_age_s": w.last_heartbeat_age_s,
                         "alive": w.alive, "metrics": readings.get(w.name)})
    for name, reading in readings.items():
        if name not in seen:  # a metrics URL whose worker has no heartbeat (yet, or any more)
            rows.append({"model": reading.get("model"), "name": name, "last_heartbeat_age_s": None, "alive": False,
                         "metrics": reading})
    return {"object": "list", "data": rows, "sampled_at": snaps[-1].at if snaps else None}


@router.get("/dashboard/api/series")
async def series(request: Request, model: Optional[str] = None, who: Viewer = Depends(operator)):
    """Backlog, throughput and TTFT over the last minutes (one point per sample interval)."""
    sampler = sampler_of(request)
    return {"object": "list", "interval_s": sampler.every_s, "window_s": sampler.window_s,
            "data": sampler.series(model)}
