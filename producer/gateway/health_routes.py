"""/health (liveness: Redis reachable, live workers per model), /ready (readiness:
at least one live worker serves a model) and /metrics."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inferq.producer.gateway.config import allowed_models
from inferq.producer.gateway.runner import ctx_of

router = APIRouter()
# Its own router: served on the main port, or alone on GatewaySettings.metrics_port.
metrics_router = APIRouter()


@router.get("/health")
async def health(request: Request):
    ctx = ctx_of(request)
    if not await ctx.backend.ping():
        return JSONResponse({"status": "unavailable", "redis": False, "models": {}}, status_code=503)
    names = sorted(set(allowed_models(ctx.settings)) | set(await ctx.backend.known_models(max_age_s=0)))
    models = {m: {"live_workers": await ctx.backend.live_worker_count(m)} for m in names}
    serving = any(v["live_workers"] > 0 for v in models.values())
    return {"status": "ok" if serving else "no_workers", "redis": True, "models": models}


@router.get("/ready")
async def ready(request: Request):
    """Readiness: 200 only once a live worker serves a model this gateway offers,
    so `inferq up`, compose and Kubernetes route traffic only when a request can
    actually be served; 503 with the reason (and Retry-After) until then."""
    ctx = ctx_of(request)
    if not await ctx.backend.ping():
        return _not_ready("the queue (Redis) is unreachable", {})
    allow = allowed_models(ctx.settings)
    names = allow or await ctx.backend.known_models(max_age_s=0)
    models = {m: {"live_workers": await ctx.backend.live_worker_count(m)} for m in names}
    if not any(v["live_workers"] > 0 for v in models.values()):
        offered = ", ".join(names) or "no model registered yet"
        return _not_ready(f"no live worker serves a model yet ({offered})", models)
    return {"status": "ready", "models": models}


def _not_ready(reason: str, models: dict) -> JSONResponse:
    return JSONResponse({"status": "not_ready", "reason": reason, "models": models}, status_code=503,
                        headers={"Retry-After": "2"})


@metrics_router.get("/metrics")
async def metrics(request: Request):
    ctx = ctx_of(request)
    try:
        tenants = frozenset(p.tenant for p in request.app.state.api_keys.values() if p.tenant)
        ctx.metrics.set_queue_stats(await ctx.backend.queue_stats(), tenants)
    except Exception:
        pass  # Redis down: still export the gateway's own counters
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
