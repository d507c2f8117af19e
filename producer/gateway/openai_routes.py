"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""
from __future__ import annotations

import time
from typing import Optional

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from inferq.producer.gateway import openai_format as fmt
from inferq.producer.gateway import sse
from inferq.schemas.fold import Assembly, ReplyDiverged, ReplyGap
from inferq.schemas.redis_errors import UNAVAILABLE
from inferq.producer.gateway.auth import authenticate
from inferq.producer.gateway.config import Principal, allowed_models
from inferq.producer.errors import JobNotFound
from inferq.producer.gateway.errors import APIError, job_expired_error, reply_diverged_error, reply_gap_error
from inferq.producer.gateway.openai_jobs import prepare_chat, prepare_completion
from inferq.producer.gateway.openai_schemas import ChatCompletionRequest, CompletionRequest
from inferq.producer.gateway.openai_tools import ToolDeltas
from inferq.producer.gateway.reasoning import ReasoningDeltas
from inferq.producer.gateway.runner import (
    Context, GatewayTimeout, admit, cancel_shielded, ctx_of, raise_for_error, resolve_model, stream_pieces,
    wait_for_result,
)

router = APIRouter()


def _job_headers(job_id: str) -> dict[str, str]:
    return {"X-Inferq-Job-Id": job_id}


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    p = await prepare_completion(ctx, req, lambda name: resolve_model(ctx, name), tenant=principal.tenant,
                                 deadline=time.time() + ctx.settings.request_timeout_s)
    job_id = (await admit(ctx, p.job)).job_id
    ctx.metrics.jobs_submitted.labels(route="completions").inc()
    if req.stream:
        return StreamingResponse(_stream(ctx, "completions", job_id, p.model, req.include_usage, req.logprobs,
                                         p.prefix, echo_logprobs=p.echo_logprobs,
                                         prompt_logprobs_n=req.prompt_logprobs, n=req.n),
                                 media_type="text/event-stream", headers={**sse.SSE_HEADERS, **_job_headers(job_id)})
    asm = await wait_for_result(ctx, request, job_id)
    raise_for_error(asm, job_id)
    return _json(p.body(job_id, asm), job_id)


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    p = await prepare_chat(ctx, req, lambda name: resolve_model(ctx, name), tenant=principal.tenant,
                           deadline=time.time() + ctx.settings.request_timeout_s)
    job_id = (await admit(ctx, p.job)).job_id
    ctx.metrics.jobs_submitted.labels(route="chat.completions").inc()
    if req.stream:
        return StreamingResponse(_stream(ctx, "chat", job_id, p.model, req.include_usage, p.logprobs_n, "",
                                         prompt_logprobs_n=req.prompt_logprobs,
                                         tools=p.tools.deltas() if p.tools else None, n=req.n,
                                         reasoning=ReasoningDeltas(p.reasoning) if p.reasoning else None),
                                 media_type="text/event-stream", headers={**sse.SSE_HEADERS, **_job_headers(job_id)})
    asm = await wait_for_result(ctx, request, job_id)
    raise_for_error(asm, job_id)
    return _json(p.body(job_id, asm), job_id)


def _json(body: dict, job_id: str):
    from fastapi.responses import JSONResponse

    return JSONResponse(body, headers=_job_headers(job_id))


async def _stream(ctx: Context, kind: str, job_id: str, model: str, include_usage: bool,
                  logprobs_n: Optional[int], prefix: str, echo_logprobs: bool = False,
                  prompt_logprobs_n: Optional[int] = None, tools: Optional[ToolDeltas] = None, n: int = 1,
                  reasoning: Optional[ReasoningDeltas] = None):
    """SSE body in OpenAI's chunk format. With ``tools`` (chat with tools, one choice)
    the tool-call parser decides which text is content and which is a call. With
    ``reasoning`` (a thinking model) the think block goes out as ``reasoning_content``
    deltas, before the tool-call parser sees the content. With ``n`` > 1
    the choices' chunks are interleaved as they come, each naming its ``index``. If the
    client disconnects, Starlette cancels this generator and the ``finally`` cancels the job."""
    created = int(time.time())
    asm = Assembly(check_shown=True)  # an SSE stream cannot take text back
    started = time.monotonic()
    first_token_at: Optional[float] = None
    last_sent = time.monotonic()
    ctx.metrics.active_streams.inc()
    try:
        for i in range(n):
            if kind == "chat":
                yield sse.data(fmt.chat_chunk(job_id, model, created, {"role": "assistant", "content": ""},
                                              include_usage=include_usage, index=i))
            elif prefix and not echo_logprobs:
                yield sse.data(fmt.completion_chunk(job_id, model, created, prefix, include_usage=include_usage,
                                                    index=i))
        offset = len(prefix)
        other_offsets = {i: len(prefix) for i in range(1, n)}  # choices 1..n-1 (text offsets of logprobs)
        prompt_sent = plp_sent = False
        # The chunk of a token without logprobs, encoded around its text (one per token).
        if kind == "chat":
            text_chunk = sse.TextEvents(lambda text: fmt.chat_chunk(job_id, model, created, {"content": text},
                                                                    include_usage=include_usage))
        else:
            text_chunk = sse.TextEvents(lambda text: fmt.completion_chunk(job_id, model, created, text,
                                                                          include_usage=include_usage))
        failure: Optional[APIError] = None  # ends the stream with an error chunk
        pieces = stream_pieces(ctx, job_id, asm)
        while True:
            try:
                piece = await pieces.__anext__()
            except StopAsyncIteration:
                break
            except GatewayTimeout as e:
                failure = e
                break
            except UNAVAILABLE:
                failure = APIError(503, "the queue (Redis) became unreachable during the stream",
                                     code="redis_unavailable")
                break
            except ReplyGap as e:
                failure = reply_gap_error(e)
                break
            except ReplyDiverged as e:
                ctx.metrics.stream_divergences.inc()
                failure = reply_diverged_error(e)
                break
            except JobNotFound as e:
                failure = job_expired_error(e)
                break
            if piece is None:
                if time.monotonic() - last_sent >= ctx.settings.keepalive_s:
                    last_sent = time.monotonic()
                    yield sse.KEEPALIVE
                continue
            if first_token_at is None:
                first_token_at = time.monotonic()
                ctx.metrics.ttft.observe(first_token_at - started)
            if piece.index:  # another choice of an n > 1 request
                lp = fmt.piece_logprobs(piece, kind, logprobs_n, other_offsets.get(piece.index, 0))
                other_offsets[piece.index] = other_offsets.get(piece.index, 0) + len(piece.text)
                last_sent = time.monotonic()
                text = piece.text
                if reasoning is not None:
                    thought, text = reasoning.feed(text, piece.index)
                    if thought:
                        yield sse.data(fmt.chat_chunk(job_id, model, created, {"reasoning_content": thought},
                                                      logprobs=lp, include_usage=include_usage, index=piece.index))
                        lp = None
                    if not text and lp is None:
                        continue
                yield sse.data(fmt.chat_chunk(job_id, model, created, {"content": text}, logprobs=lp,
                                              include_usage=include_usage, index=piece.index) if kind == "chat" else
                               fmt.completion_chunk(job_id, model, created, piece.text, logprobs=lp,
                                                    include_usage=include_usage, index=piece.index))
                continue
            if echo_logprobs and not prompt_sent:
                # The first delta carries the prompt's logprobs: the echoed prompt goes out with them.
                prompt_sent = True
                yield sse.data(fmt.completion_chunk(job_id, model, created, prefix, include_usage=include_usage,
                                                    logprobs=fmt.echo_logprobs(asm, logprobs_n)))
            lp = fmt.piece_logprobs(piece, kind, logprobs_n, offset)
            offset += len(piece.text)
            text = piece.text
            if reasoning is not None:
                thought, text = reasoning.feed(text)
                if thought:
                    chunk = fmt.chat_chunk(job_id, model, created, {"reasoning_content": thought}, logprobs=lp,
                                           include_usage=include_usage)
                    if prompt_logprobs_n is not None and not plp_sent:
                        plp_sent = True
                        chunk["prompt_logprobs"] = fmt.prompt_logprobs_body(asm, prompt_logprobs_n)
                    last_sent = time.monotonic()
                    yield sse.data(chunk)
                    lp = None
                if not text and lp is None and (prompt_logprobs_n is None or plp_sent):
                    continue
            if tools is not None:
                # A piece may give no delta (text held while a call may be opening): its
                # logprobs then ride on an empty delta.
                plp_due = prompt_logprobs_n is not None and not plp_sent
                deltas = tools.feed(text) or ([{}] if lp is not None or plp_due else [])
                for i, delta in enumerate(deltas):
                    chunk = fmt.chat_chunk(job_id, model, created, delta, logprobs=lp if i == 0 else None,
                                           include_usage=include_usage)
                    if prompt_logprobs_n is not None and not plp_sent:
                        plp_sent = True
                        chunk["prompt_logprobs"] = fmt.prompt_logprobs_body(asm, prompt_logprobs_n)
                    last_sent = time.monotonic()
                    yield sse.data(chunk)
                continue
            if lp is None and (prompt_logprobs_n is None or plp_sent):
                last_sent = time.monotonic()
                yield text_chunk(text)
                continue
            if kind == "chat":
                chunk = fmt.chat_chunk(job_id, model, created, {"content": text}, logprobs=lp,
                                       include_usage=include_usage)
            else:
                chunk = fmt.completion_chunk(job_id, model, created, text, logprobs=lp,
                                             include_usage=include_usage)
            if prompt_logprobs_n is not None and not plp_sent:  # with the first content chunk
                plp_sent = True
                body = fmt.prompt_logprobs_body(asm, prompt_logprobs_n)
                if kind == "chat":
                    chunk["prompt_logprobs"] = body
                else:
                    chunk["choices"][0]["prompt_logprobs"] = body
            last_sent = time.monotonic()
            yield sse.data(chunk)
        if failure is not None:
            yield sse.data(failure.body())
        elif asm.error_code is not None:
            try:
                raise_for_error(asm, job_id)
            except APIError as e:
                yield sse.data(e.body())
        else:
            if reasoning is not None:  # text a tag might still have started: the output is over
                for i in range(n):
                    thought, text = reasoning.finish(i)
                    if thought:
                        yield sse.data(fmt.chat_chunk(job_id, model, created, {"reasoning_content": thought},
                                                      include_usage=include_usage, index=i))
                    for delta in (tools.feed(text) if tools is not None else [{"content": text}]) if text else []:
                        yield sse.data(fmt.chat_chunk(job_id, model, created, delta, include_usage=include_usage,
                                                      index=i))
            if tools is not None:  # tools answer with one choice (n > 1 with tools is a 400)
                for delta in tools.finish():
                    yield sse.data(fmt.chat_chunk(job_id, model, created, delta, include_usage=include_usage))
                yield sse.data(fmt.chat_chunk(job_id, model, created, {}, finish_reason=tools.finish_reason(asm.finish_reason),
                                              include_usage=include_usage))
            else:
                for c in asm.choices() if n > 1 else [None]:
                    index, reason = (0, asm.finish_reason) if c is None else (c.index, c.finish_reason)
                    if kind == "chat":
                        yield sse.data(fmt.chat_chunk(job_id, model, created, {}, finish_reason=reason,
                                                      include_usage=include_usage, index=index))
                    else:
                        yield sse.data(fmt.completion_chunk(job_id, model, created, "", finish_reason=reason,
                                                            include_usage=include_usage, index=index))
            if include_usage:
                usage = (fmt.chat_usage_chunk if kind == "chat" else fmt.completion_usage_chunk)(
                    job_id, model, created, asm.usage)
                yield sse.data(usage)
        yield sse.DONE
    finally:
        ctx.metrics.active_streams.dec()
        if not asm.finished:
            await cancel_shielded(ctx, job_id)


@router.get("/v1/models")
async def list_models(request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    names = allowed_models(ctx.settings) or await ctx.backend.known_models(max_age_s=0)
    data = []
    for name in names:
        data.append({"id": name, "object": "model", "created": 0, "owned_by": "inferq",
                     "live_workers": await ctx.backend.live_worker_count(name)})
    return {"object": "list", "data": data}


@router.get("/v1/models/{model}")
async def get_model(model: str, request: Request, principal: Principal = Depends(authenticate)):
    ctx = ctx_of(request)
    names = allowed_models(ctx.settings) or await ctx.backend.known_models(max_age_s=0)
    if model not in names:
        raise APIError(404, f"model '{model}' does not exist", code="model_not_found", param="model")
    return {"id": model, "object": "model", "created": 0, "owned_by": "inferq"}
