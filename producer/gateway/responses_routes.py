"""OpenAI's Responses API: ``/v1/responses`` create, retrieve (and stream, resumable
with ``starting_after``), cancel, delete, input items; background mode.

A response is a chat job on the queue (responses_jobs.py) whose id is
``resp_<job id>``. Its state is read from durable records (responses_state.py),
its stream events are a function of its reply stream (responses_format.py).
A foreground stream or wait cancels the job when the client goes away, as chat
does; a background response runs on whatever its clients do.
"""
from __future__ import annotations

import time
from typing import Literal, Optional

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from inferq.schemas import keys
from inferq.schemas.fold import ReplyDiverged, ReplyGap
from inferq.schemas.redis_errors import UNAVAILABLE
from inferq.producer.errors import JobNotFound
from inferq.producer.gateway import sse
from inferq.producer.gateway.auth import authenticate
from inferq.producer.gateway.config import Principal
from inferq.producer.gateway.errors import bad_request
from inferq.producer.gateway.responses_format import FINAL, Outcome, ResponseEvents, folded_body, response_body
from inferq.producer.gateway.responses_jobs import ROUTE, prepare_response
from inferq.producer.gateway.responses_schemas import ResponseRequest
from inferq.producer.gateway.responses_spec import ResponseSpec
from inferq.producer.gateway.responses_state import ResponsesService
from inferq.producer.gateway.runner import (
    Context, admit, cancel_shielded, ctx_of, raise_for_error, resolve_model, wait_for_result,
)

router = APIRouter()


def service_of(request: Request) -> ResponsesService:
    return request.app.state.responses


def _headers(job_id: str) -> dict[str, str]:
    return {"X-Inferq-Job-Id": job_id}


@router.post("/v1/responses")
async def create_response(req: ResponseRequest, request: Request, principal: Principal = Depends(authenticate)):
    ctx, service = ctx_of(request), service_of(request)
    spec, job = await prepare_response(ctx, req, lambda name: resolve_model(ctx, name),
                                       lambda prev: service.conversation_after(prev, principal),
                                       tenant=principal.tenant)
    await admit(ctx, job)
    ctx.metrics.jobs_submitted.labels(route=ROUTE).inc()
    if spec.store:  # after admission: a record always has its job
        await service.store.save(spec)
    if req.stream:
        return _event_stream(ctx, spec, starting_after=-1, cancel_on_disconnect=not spec.background)
    if spec.background:
        return JSONResponse(response_body(spec, Outcome("queued"), [], None), headers=_headers(spec.job_id))
    asm = await wait_for_result(ctx, request, spec.job_id)
    raise_for_error(asm, spec.job_id)
    body = folded_body(spec, asm, None)
    if spec.store:
        await service.store.save_final(spec.job_id, body)
    return JSONResponse(body, headers=_headers(spec.job_id))


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request, principal: Principal = Depends(authenticate),
                            stream: bool = False, starting_after: Optional[int] = Query(None, ge=-1)):
    ctx, service = ctx_of(request), service_of(request)
    stored = await service.load(response_id, principal)
    if stream:
        if stored.final is not None and not await ctx.backend.redis.exists(keys.reply(stored.spec.job_id)):
            raise bad_request(f"the events of response '{response_id}' expired; retrieve it without stream",
                              param="stream", code="stream_expired")
        return _event_stream(ctx, stored.spec, starting_after=-1 if starting_after is None else starting_after,
                             cancel_on_disconnect=False)
    return JSONResponse(await service.body(stored), headers=_headers(stored.spec.job_id))


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request, principal: Principal = Depends(authenticate)):
    ctx, service = ctx_of(request), service_of(request)
    stored = await service.load(response_id, principal)
    if not stored.spec.background:
        raise bad_request("Only responses created with background: true can be cancelled.", param="response_id")
    body = await service.body(stored)
    if body["status"] in FINAL:
        return JSONResponse(body, headers=_headers(stored.spec.job_id))
    await ctx.backend.cancel(stored.spec.job_id)
    # The worker ends the job at its next step (a queued job when a worker takes it):
    # wait a little for that, so the answer usually shows the job's own end.
    end = time.monotonic() + 5.0
    while time.monotonic() < end and not (await ctx.backend.history(stored.spec.job_id)).finished:
        await anyio.sleep(0.1)
    body = await service.body(await service.load(response_id, principal))
    return JSONResponse(body, headers=_headers(stored.spec.job_id))


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request, principal: Principal = Depends(authenticate)):
    ctx, service = ctx_of(request), service_of(request)
    stored = await service.load(response_id, principal)
    if stored.final is None:  # a deleted response has no one left to read it
        await ctx.backend.cancel(stored.spec.job_id)
    await service.store.delete(stored.spec.job_id, stored.spec.tenant)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request, principal: Principal = Depends(authenticate),
                           after: Optional[str] = None, limit: int = Query(20, ge=1, le=100),
                           order: Literal["asc", "desc"] = "desc"):
    stored = await service_of(request).load(response_id, principal)
    items = list(stored.spec.input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise bad_request(f"no input item '{after}' in response '{response_id}'", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


# -- streaming ------------------------------------------------------------------------
def _event_stream(ctx: Context, spec: ResponseSpec, *, starting_after: int, cancel_on_disconnect: bool):
    return StreamingResponse(_events(ctx, spec, starting_after, cancel_on_disconnect), media_type="text/event-stream",
                             headers={**sse.SSE_HEADERS, **_headers(spec.job_id)})


async def _events(ctx: Context, spec: ResponseSpec, starting_after: int, cancel_on_disconnect: bool):
    """The response's events after ``starting_after``, from its reply stream read from
    the start (so the numbering is the same for every reader)."""
    gen = ResponseEvents(spec)
    last_sent = time.monotonic()
    give_up = time.monotonic() + ctx.settings.request_timeout_s + min(30.0, ctx.settings.request_timeout_s)

    def send(events: list[dict]):
        return [sse.event(ev, name=ev["type"]) for ev in events if ev["sequence_number"] > starting_after]

    ctx.metrics.active_streams.inc()
    try:
        for chunk in send(gen.opening()):
            yield chunk
        try:
            async for _, event in ctx.backend.events(spec.job_id):
                if event is None:
                    if cancel_on_disconnect and time.monotonic() > give_up:
                        for chunk in send(gen.failure("timeout", f"the response did not finish within "
                                                                 f"{ctx.settings.request_timeout_s:.0f}s")):
                            yield chunk
                        break
                    if time.monotonic() - last_sent >= ctx.settings.keepalive_s:
                        last_sent = time.monotonic()
                        yield sse.KEEPALIVE
                    continue
                chunks = send(gen.feed(event))
                if chunks:
                    last_sent = time.monotonic()
                for chunk in chunks:
                    yield chunk
                if gen.ended:
                    break
        except ReplyDiverged as e:
            ctx.metrics.stream_divergences.inc()
            failure = gen.failure("reply_diverged", str(e))
        except ReplyGap as e:
            failure = gen.failure("reply_stream_gap", str(e))
        except JobNotFound as e:
            failure = gen.failure("response_expired", str(e))
        except UNAVAILABLE:
            failure = gen.failure("redis_unavailable", "the queue (Redis) became unreachable during the stream")
        else:
            failure = []
        for chunk in send(failure):
            yield chunk
    finally:
        ctx.metrics.active_streams.dec()
        if cancel_on_disconnect and not gen.ended:
            await cancel_shielded(ctx, spec.job_id)
