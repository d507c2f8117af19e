"""What every generation route does: pick the model, admit the job, then wait
for or stream its output, and cancel it when the client goes away."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

import anyio
from fastapi import Request
from pydantic import ValidationError

from inferq.schemas import Job
from inferq.producer.admission import Admitted
from inferq.producer.errors import QueueFull, QueueUnavailable, RateLimited

from inferq.schemas.fold import Assembly, Piece
from inferq.producer.gateway.backend import Backend
from inferq.producer.gateway.config import GatewaySettings, allowed_models
from inferq.producer.gateway.errors import APIError, bad_request


@dataclass
class Context:
    backend: Backend
    settings: GatewaySettings
    default_model: str
    metrics: Any  # inferq.producer.gateway.metrics.GatewayMetrics
    reasoning: Any = None  # inferq.producer.gateway.reasoning.ReasoningFamilies, made on first use


def ctx_of(request: Request) -> Context:
    return request.app.state.ctx


async def resolve_model(ctx: Context, name: Optional[str], require_worker: bool = True) -> str:
    """404 for a model nobody serves, 503 when its workers are all gone (or, for
    a model on the allow-list, have not registered yet: a service starting up).
    ``require_worker=False`` (batch lines, which may wait in the queue) skips the 503."""
    model = name or ctx.default_model
    allow = allowed_models(ctx.settings)
    known = await ctx.backend.known_models()
    if allow and model not in allow:
        raise APIError(404, f"model '{model}' does not exist; this gateway serves: {', '.join(allow)}",
                       code="model_not_found", param="model")
    if not allow and model not in known:
        served = ", ".join(known) or "none yet (no worker has registered)"
        raise APIError(404, f"model '{model}' does not exist; models with workers: {served}",
                       code="model_not_found", param="model")
    if require_worker and await ctx.backend.live_worker_count(model) == 0:
        raise APIError(503, f"no live worker serves model '{model}'; start one with `inferq worker`",
                       code="no_worker", headers={"Retry-After": "5"})
    return model


def make_job(**fields) -> Job:
    try:
        return Job(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'job'}: {err['msg']}" for err in e.errors())
        raise bad_request(problems) from None


async def admit(ctx: Context, job: Job, idempotency_key: Optional[str] = None) -> Admitted:
    try:
        admitted = await ctx.backend.submit(job, idempotency_key)
    except QueueUnavailable as e:
        ctx.metrics.rejected.labels(reason="redis_refusing_writes").inc()
        raise APIError(503, str(e), code="queue_unavailable", headers={"Retry-After": "5"}) from None
    except QueueFull as e:
        ctx.metrics.rejected.labels(reason="queue_full").inc()
        raise APIError(429, str(e), code="queue_full", headers={"Retry-After": "1"}) from None
    except RateLimited as e:
        ctx.metrics.rejected.labels(reason="rate_limited").inc()
        raise APIError(429, str(e), code="rate_limited",
                       headers={"Retry-After": str(max(1, math.ceil(e.retry_after)))}) from None
    return admitted


# Worker error codes that mean the request itself was bad.
_CLIENT_ERROR_HINTS = ("invalid", "too_long", "too_large", "bad_", "validation", "empty", "unsupported",
                       "no_chat_template")


def raise_for_error(asm: Assembly, job_id: str) -> None:
    if asm.error_code is None:
        return
    code = asm.error_code
    headers = {"X-Inferq-Job-Id": job_id}
    if code in ("unknown_model", "model_not_found"):
        raise APIError(404, asm.error_message or code, code=code, headers=headers)
    if any(h in code for h in _CLIENT_ERROR_HINTS):
        raise APIError(400, asm.error_message or code, code=code, headers=headers)
    raise APIError(500, f"generation failed [{code}]: {asm.error_message}", code=code, type="server_error",
                   headers=headers)


async def cancel_shielded(ctx: Context, job_id: str) -> None:
    """Cancel even while the surrounding task is being cancelled (client gone)."""
    with anyio.CancelScope(shield=True):
        try:
            await ctx.backend.cancel(job_id)
            ctx.metrics.cancelled_on_disconnect.inc()
        except Exception:
            pass


class GatewayTimeout(APIError):
    def __init__(self, seconds: float, job_id: str):
        super().__init__(504, f"job {job_id} did not finish within {seconds:.0f}s; it was cancelled", code="timeout",
                         type="server_error", headers={"X-Inferq-Job-Id": job_id})


def _give_up_after(ctx: Context) -> float:
    # The job's own deadline makes the worker end it; this is the backstop for a
    # job no worker ever picks up.
    timeout = ctx.settings.request_timeout_s
    return time.monotonic() + timeout + min(30.0, timeout)


async def wait_for_result(ctx: Context, request: Request, job_id: str) -> Assembly:
    """Collect the whole output; cancel the job if the client disconnects."""
    asm = Assembly()
    finished = False
    give_up = _give_up_after(ctx)
    next_check = time.monotonic() + 1.0
    try:
        async for _, event in ctx.backend.events(job_id):
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 1.0
                if await request.is_disconnected():
                    break
                if now > give_up:
                    raise GatewayTimeout(ctx.settings.request_timeout_s, job_id)
            if event is None:
                continue
            asm.feed(event)
            if asm.finished:
                finished = True
                break
    finally:
        if not finished:
            await cancel_shielded(ctx, job_id)
    return asm


async def stream_pieces(ctx: Context, job_id: str, asm: Assembly) -> AsyncIterator[Optional[Piece]]:
    """New visible output as it arrives; None on idle ticks (for keepalives).
    The caller's ``finally`` decides about cancellation."""
    give_up = _give_up_after(ctx)
    async for _, event in ctx.backend.events(job_id):
        if time.monotonic() > give_up:
            raise GatewayTimeout(ctx.settings.request_timeout_s, job_id)
        if event is None:
            yield None
            continue
        piece = asm.feed(event)
        if piece is not None:
            yield piece
        if asm.finished:
            return
