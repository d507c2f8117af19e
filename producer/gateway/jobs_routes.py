"""The native jobs API: submit now, read later, stream resumably, cancel.

Unlike the OpenAI streams, a disconnect here does not cancel the job: the
events stream is meant to be resumed with Last-Event-ID. DELETE cancels.
"""
from __future__ import annotations

import re
import time
from typing import Any, Literal, Optional

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferq.schemas import SamplingParams, keys, records
from inferq.schemas.events import TERMINAL_TYPES
from inferq.schemas.fold import ReplyGap
from inferq.schemas.text import as_str
from inferq.producer.errors import JobNotFound
from inferq.producer.gateway import sse
from inferq.producer.gateway.auth import authenticate, can_access
from inferq.producer.gateway.config import Principal
from inferq.producer.gateway.errors import APIError, bad_request
from inferq.producer.gateway.openai_schemas import check_prompt_size
from inferq.producer.gateway.runner import Context, admit, ctx_of, make_job, resolve_model

router = APIRouter()

_ENTRY_ID = r"^\d+-\d+$"


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[dict[str, Any]]] = None
    prompt_token_ids: Optional[list[int]] = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    priority: int = 0
    priority_class: Literal["interactive", "batch"] = "interactive"
    session_id: Optional[str] = Field(None, min_length=1, max_length=256)
    deadline: Optional[float] = Field(None, description="Unix time.")
    timeout_s: Optional[float] = Field(None, gt=0, description="Relative deadline; ignored if deadline is set.")
    idempotency_key: Optional[str] = Field(None, min_length=1, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)


async def _owned_job(ctx: Context, principal: Principal, job_id: str) -> dict:
    """The job's info hash, or 404 (also for another tenant's job: no leaking ids)."""
    info = await ctx.backend.info(job_id)
    if info is None or not can_access(principal, info.get("tenant") or None):
        raise APIError(404, f"job '{job_id}' not found", code="job_not_found")
    return info


@router.post("/v1/jobs", status_code=202)
async def submit_job(req: JobRequest, request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    try:
        sampling = SamplingParams(**req.sampling)
    except ValidationError as e:
        raise bad_request("; ".join(f"sampling.{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())) from None
    if sampling.max_tokens > ctx.settings.max_tokens_cap:
        raise bad_request(f"max_tokens={sampling.max_tokens} exceeds this gateway's cap of {ctx.settings.max_tokens_cap}",
                          param="sampling.max_tokens")
    messages = req.messages
    if messages is not None and not all(isinstance(m.get("content"), str) for m in messages):
        raise bad_request("every message needs a string 'content'", param="messages")
    check_prompt_size(ctx.settings, text=req.prompt, token_ids=req.prompt_token_ids, messages=messages)
    model = await resolve_model(ctx, req.model)
    deadline = req.deadline if req.deadline is not None else (time.time() + req.timeout_s if req.timeout_s else None)
    job = make_job(model=model, prompt=req.prompt, messages=messages, prompt_token_ids=req.prompt_token_ids,
                   sampling=sampling, priority=req.priority, priority_class=req.priority_class, deadline=deadline,
                   tenant=principal.tenant, session_id=req.session_id,
                   metadata=req.metadata)
    adm = await admit(ctx, job, req.idempotency_key)
    ctx.metrics.jobs_submitted.labels(route="jobs").inc()
    # A duplicate answers with the earlier job and its real status (it may be done).
    body = {"id": adm.job_id, "object": "job", "status": adm.status, "model": model,
            "duplicate": adm.duplicate, "events_url": f"/v1/jobs/{adm.job_id}/events"}
    if adm.replicas is not None:  # INFERQ_ADMISSION_REPLICAS: say whether the replicas have it
        body.update(replicas=adm.replicas, replicated=adm.replicated)
    return JSONResponse(body, status_code=202)


@router.get("/v1/jobs/{job_id}")
async def get_job(job_id: str, request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    info = await _owned_job(ctx, principal, job_id)
    asm = await ctx.backend.history(job_id)
    recorded = info.get("status")
    if recorded in records.FINAL_STATUSES:
        status = recorded  # the worker's own verdict (it knows a cancel from a plain abort)
    elif asm.error_code is not None:
        status = "error"
    elif asm.finished:
        status = "done"
    else:
        status = recorded or ("running" if asm.worker else "queued")
    error = {"code": asm.error_code, "message": asm.error_message} if asm.error_code else None
    return {
        "id": job_id, "object": "job", "status": status, "model": info.get("model"),
        "attempt": asm.attempt, "text": asm.text, "token_ids": asm.token_ids,
        "finish_reason": asm.finish_reason, "usage": asm.usage, "timings": asm.timings, "error": error,
    }


@router.delete("/v1/jobs/{job_id}")
async def cancel_job(job_id: str, request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    await _owned_job(ctx, principal, job_id)
    await ctx.backend.cancel(job_id)
    return {"id": job_id, "object": "job", "cancel_requested": True}


@router.get("/v1/jobs/{job_id}/events")
async def job_events(job_id: str, request: Request, principal: Principal = Depends(authenticate),
                     last_event_id: Optional[str] = Header(None, alias="Last-Event-ID"),
                     from_id: Optional[str] = Query(None, alias="last_event_id")):
    ctx = ctx_of(request)
    await _owned_job(ctx, principal, job_id)
    start = last_event_id or from_id or "0-0"
    # Each part of a stream id is a 64-bit number; Redis refuses bigger ones mid-stream.
    if not re.fullmatch(_ENTRY_ID, start) or any(int(part) >= 2**64 for part in start.split("-")):
        raise bad_request(f"Last-Event-ID must be a reply entry id like '1700000000000-0', got {start!r}")
    last = await ctx.backend.redis.xrevrange(keys.reply(job_id), count=1)
    if last:
        last_id = as_str(last[0][0])
        last_type = as_str(last[0][1].get(b"type", last[0][1].get("type", "")))
        if last_type in TERMINAL_TYPES and _id_le(last_id, start):
            # At or past the terminal event: nothing more will ever come.
            return StreamingResponse(iter(()), media_type="text/event-stream", headers=sse.SSE_HEADERS)
        if not _id_le(start, last_id):
            # A running job, and no client was ever sent this id: waiting after
            # it could outlast the job, so say so instead of hanging.
            raise bad_request(f"Last-Event-ID {start} is after this job's last event ({last_id})")
    return StreamingResponse(_events(ctx, job_id, start), media_type="text/event-stream", headers=sse.SSE_HEADERS)


def _id_le(a: str, b: str) -> bool:
    pa, pb = tuple(map(int, a.split("-"))), tuple(map(int, b.split("-")))
    return pa <= pb


async def _events(ctx: Context, job_id: str, start: str):
    last_sent = time.monotonic()
    yield "retry: 1000\n\n"
    try:
        async for entry_id, event in ctx.backend.events(job_id, start):
            if event is None:
                if time.monotonic() - last_sent >= ctx.settings.keepalive_s:
                    last_sent = time.monotonic()
                    yield sse.KEEPALIVE
                continue
            last_sent = time.monotonic()
            yield sse.event(event.model_dump(mode="json"), event_id=entry_id, name=event.type)
    except (JobNotFound, ReplyGap) as e:
        # Said in the stream (its 200 head is gone already): the job's records
        # expired, or events it needs were lost.
        code = "job_expired" if isinstance(e, JobNotFound) else "reply_stream_gap"
        yield sse.event({"code": code, "message": str(e)}, name="error")
