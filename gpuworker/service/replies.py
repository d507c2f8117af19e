"""Reply-stream writes, recorded into a Batch so each caller sends one pipeline."""
from __future__ import annotations

import json
import time
from typing import Optional

from pydantic import BaseModel

from schemas import DoneEvent, RestartedEvent, StartedEvent, Timings, Usage, encode_event, keys, records

from gpuworker.service.batch import Batch
from gpuworker.service.context import WorkerContext
from gpuworker.service.state import JobState


def add_event(b: Batch, ctx: WorkerContext, job_id: str, event: BaseModel) -> None:
    # Reply streams are bounded (MAXLEN ~); the job stream never is.
    b.xadd(keys.reply(job_id), encode_event(event), maxlen=ctx.reply_maxlen, approximate=True)


def add_delta(b: Batch, ctx: WorkerContext, st: JobState, text: str, token_ids: list, logprobs) -> None:
    """The hot path: the same fields ``encode_event(DeltaEvent(...))`` writes,
    serialised without building a pydantic model per token."""
    lps = None if logprobs is None else [{str(k): v for k, v in d.items()} for d in logprobs]
    data = json.dumps({"attempt": st.attempt, "seq": st.next_seq(), "text": text, "token_ids": list(token_ids),
                       "logprobs": lps}, ensure_ascii=False, separators=(",", ":"))
    b.xadd(keys.reply(st.id), {"type": "delta", "data": data}, maxlen=ctx.reply_maxlen, approximate=True)


def start(b: Batch, ctx: WorkerContext, st: JobState) -> None:
    if st.attempt > 1:
        add_event(b, ctx, st.id, RestartedEvent(attempt=st.attempt, seq=st.next_seq(), reason="redelivered"))
    add_event(b, ctx, st.id, StartedEvent(attempt=st.attempt, seq=st.next_seq(), worker=ctx.consumer))
    records.mark_running(b, st.id, records.info_running(ctx.consumer, st.attempt, st.received_at, st.job.model,
                                                        st.job.tenant), ctx.live_ttl)


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
    status = records.CANCELLED if (reason == "abort" and st.cancel_requested) else records.DONE
    records.close_job(b, st.id, records.info_done(status, reason, usage.prompt_tokens, usage.completion_tokens),
                      ctx.reply_ttl)
    b.xack(ctx.stream, ctx.group, st.entry_id)
    b.xdel(ctx.stream, st.entry_id)
    return ev


def fail(b: Batch, ctx: WorkerContext, *, entry_id: str, raw, job_id: Optional[str], attempt: int,
         seq: int, code: str, message: str) -> None:
    """``error`` event (when the job id is known), DLQ copy, ack + delete."""
    records.fail_job(b, model=ctx.model, entry_id=entry_id, raw=raw, job_id=job_id, attempt=attempt, seq=seq,
                     code=code, message=message, worker=ctx.consumer, ttl_after_done=ctx.reply_ttl,
                     reply_maxlen=ctx.reply_maxlen)
