"""Reply-stream writes, recorded into a Batch so each caller sends one pipeline."""
from __future__ import annotations

import json
import time
from typing import Optional

from pydantic import BaseModel

from schemas import DoneEvent, ErrorEvent, RestartedEvent, StartedEvent, Timings, Usage, encode_event, keys

from gpuworker.service.batch import Batch
from gpuworker.service.context import WorkerContext
from gpuworker.service.dlq import dead_letter
from gpuworker.service.state import JobState


def add_event(b: Batch, ctx: WorkerContext, job_id: str, event: BaseModel) -> None:
    # Reply streams are bounded (MAXLEN ~); the job stream never is.
    b.xadd(keys.reply(job_id), encode_event(event), maxlen=ctx.reply_maxlen, approximate=True)


def add_delta(b: Batch, ctx: WorkerContext, st: JobState, text: str, token_ids: list, logprobs,
              prompt_logprobs=None) -> None:
    """The hot path: the same fields ``encode_event(DeltaEvent(...))`` writes,
    serialised without building a pydantic model per token."""
    lps = None if logprobs is None else [{str(k): v for k, v in d.items()} for d in logprobs]
    body = {"attempt": st.attempt, "seq": st.next_seq(), "text": text, "token_ids": list(token_ids), "logprobs": lps}
    if prompt_logprobs is not None:  # once per attempt, with its first delta
        body["prompt_token_ids"] = list(st.prompt_ids)
        body["prompt_logprobs"] = [None if d is None else {str(k): v for k, v in d.items()} for d in prompt_logprobs]
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    b.xadd(keys.reply(st.id), {"type": "delta", "data": data}, maxlen=ctx.reply_maxlen, approximate=True)


def start(b: Batch, ctx: WorkerContext, st: JobState) -> None:
    if st.attempt > 1:
        add_event(b, ctx, st.id, RestartedEvent(attempt=st.attempt, seq=st.next_seq(), reason="redelivered"))
    add_event(b, ctx, st.id, StartedEvent(attempt=st.attempt, seq=st.next_seq(), worker=ctx.consumer))
    b.hset(keys.job_info(st.id), mapping={
        "status": "running", "worker": ctx.consumer, "attempt": st.attempt, "started_at": repr(st.received_at),
        "model": st.job.model, "tenant": st.job.tenant or "",
    })
    b.expire(keys.reply(st.id), ctx.job_ttl)
    b.expire(keys.job_info(st.id), ctx.job_ttl)


def _close(b: Batch, ctx: WorkerContext, job_id: str, status: dict) -> None:
    b.hset(keys.job_info(job_id), mapping={**status, "finished_at": repr(time.time())})
    b.expire(keys.job_info(job_id), ctx.reply_ttl)
    b.expire(keys.reply(job_id), ctx.reply_ttl)
    b.delete(keys.cancel(job_id))


def finish(b: Batch, ctx: WorkerContext, st: JobState, reason: str, usage: Usage, now: Optional[float] = None) -> DoneEvent:
    """``done`` event, final status, then ack + delete the job entry."""
    now = time.time() if now is None else now
    created = st.created
    ev = DoneEvent(
        attempt=st.attempt, seq=st.next_seq(), finish_reason=reason, usage=usage,
        timings=Timings(
            queue=max(0.0, st.received_at - created),
            ttft=None if st.first_token_at is None else max(0.0, st.first_token_at - created),
            total=max(0.0, now - created),
        ),
    )
    add_event(b, ctx, st.id, ev)
    status = "cancelled" if (reason == "abort" and st.cancel_requested) else "done"
    _close(b, ctx, st.id, {"status": status, "finish_reason": reason,
                           "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens})
    b.xack(ctx.stream, ctx.group, st.entry_id)
    b.xdel(ctx.stream, st.entry_id)
    return ev


def fail(b: Batch, ctx: WorkerContext, *, entry_id: str, raw, job_id: Optional[str], attempt: int,
         seq: int, code: str, message: str) -> None:
    """``error`` event (when the job id is known), DLQ copy, ack + delete."""
    if job_id:
        add_event(b, ctx, job_id, ErrorEvent(attempt=attempt, seq=seq, code=code, message=message))
        _close(b, ctx, job_id, {"status": "error", "error_code": code, "error_message": message[:1000]})
    dead_letter(b, ctx, entry_id=entry_id, raw=raw, job_id=job_id or "", code=code, reason=message, attempts=attempt)
