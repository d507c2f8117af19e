"""Reply-stream writes and the job's fenced state changes, recorded into a Batch
so each caller sends one pipeline. ``start``/``finish``/``fail`` return the index
of the script's answer in the batch (see inferq.schemas.transitions: 1 done, 0 refused)."""
from __future__ import annotations

import json
import time
from typing import Optional

from inferq.schemas import DoneEvent, ErrorEvent, RestartedEvent, StartedEvent, Timings, Usage, encode_event, keys, records
from inferq.schemas import completion_events, transitions
from inferq.schemas.events import ChoiceEnd
from inferq.schemas.queues import Lane

from inferq.gpuworker.service.batch import Batch
from inferq.gpuworker.service.context import WorkerContext
from inferq.gpuworker.service.migration import resume_points
from inferq.gpuworker.service.state import JobState


def reply_cap(ctx: WorkerContext, st: JobState) -> int:
    """MAXLEN of a job's reply stream: never below what its attempts can write
    (one delta per token plus started/restarted/done, per attempt), so nothing
    a reader still needs is trimmed; the client sees a ``seq`` gap otherwise."""
    per_attempt = (st.job.sampling.max_tokens + 1) * st.job.sampling.n + 4
    return max(ctx.reply_maxlen, per_attempt * (ctx.max_deliveries + 1) + 1)


def add_delta(b: Batch, ctx: WorkerContext, st: JobState, text: str, token_ids: list, logprobs,
              prompt_logprobs=None, index: int = 0, finish_reason: Optional[str] = None) -> None:
    """The hot path: the same fields ``encode_event(DeltaEvent(...))`` writes,
    serialised without building a pydantic model per token. Deltas are not
    fenced: readers drop events of attempts they have left behind."""
    lps = None if logprobs is None else [{str(k): v for k, v in d.items()} for d in logprobs]
    body = {"attempt": st.attempt, "seq": st.next_seq(), "text": text, "token_ids": list(token_ids), "logprobs": lps}
    if index:
        body["index"] = index
    if finish_reason is not None:  # a choice of a several-choice job ends here
        body["finish_reason"] = finish_reason
    if prompt_logprobs is not None:  # once per attempt, with its first delta
        body["prompt_token_ids"] = list(st.prompt_ids)
        body["prompt_logprobs"] = [None if d is None else {str(k): v for k, v in d.items()} for d in prompt_logprobs]
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    b.xadd(st.reply_key, {"type": "delta", "data": data}, maxlen=reply_cap(ctx, st), approximate=True)


def start(b: Batch, ctx: WorkerContext, st: JobState) -> int:
    events = []
    if st.attempt > 1:
        events.append(encode_event(RestartedEvent(attempt=st.attempt, seq=st.next_seq(), reason="redelivered",
                                                  resume=resume_points(st))))
    events.append(encode_event(StartedEvent(attempt=st.attempt, seq=st.next_seq(), worker=ctx.consumer)))
    fields = records.info_running(ctx.consumer, st.attempt, st.received_at, st.job.model, st.job.tenant)
    if st.job.session_id:  # prefix affinity: the session's next jobs prefer this worker (a hint)
        b.set(keys.session(st.job.model, st.job.session_id), ctx.consumer, ex=ctx.session_ttl)
    return transitions.start(b, stream=st.lane.stream, entry_id=st.entry_id, consumer=ctx.consumer, attempt=st.attempt,
                             job_id=st.id, events=events, fields=fields, live_ttl=ctx.live_ttl,
                             reply_maxlen=reply_cap(ctx, st))


def finish(b: Batch, ctx: WorkerContext, st: JobState, reason: str, usage: Usage, now: Optional[float] = None,
           choices: Optional[list] = None, embedding: Optional[str] = None,
           max_model_len: Optional[int] = None) -> int:
    """``done`` event, final status, then ack + delete the job entry. ``embedding``
    (task embed) and ``max_model_len`` (task tokenize) ride on the ``done`` event."""
    now = time.time() if now is None else now
    created = st.created
    ev = DoneEvent(
        attempt=st.attempt, seq=st.next_seq(), finish_reason=reason, usage=usage,
        timings=Timings(
            queue=max(0.0, st.received_at - created),
            ttft=None if st.first_token_at is None else max(0.0, st.first_token_at - created),
            total=max(0.0, now - created),
        ),
        choices=None if choices is None else [
            ChoiceEnd(index=c.index, finish_reason=c.finish_reason, completion_tokens=c.completion_tokens,
                      stop_reason=c.stop_reason if isinstance(c.stop_reason, (str, int)) else None)
            for c in choices],
        embedding=embedding, max_model_len=max_model_len,
    )
    status = records.CANCELLED if (reason == "abort" and st.cancel_requested) else records.DONE
    fields = {**records.info_done(status, reason, usage.prompt_tokens, usage.completion_tokens),
              "finished_at": repr(now)}
    completion = completion_events.job_record(st.id, st.job.tenant, status, reason, st.job.metadata.get("route"), now)
    return transitions.finish(b, stream=st.lane.stream, entry_id=st.entry_id, consumer=ctx.consumer, attempt=st.attempt,
                              job_id=st.id, event=encode_event(ev), fields=fields, ttl_after_done=ctx.reply_ttl,
                              reply_maxlen=reply_cap(ctx, st), completion=completion)


def fail(b: Batch, ctx: WorkerContext, *, lane: Lane, entry_id: str, raw, job_id: Optional[str], attempt: int,
         event_attempt: int, seq: int, code: str, message: str) -> int:
    """``error`` event of ``event_attempt`` and final status (when the job id is
    known), the dead letter, then ack + delete. ``attempt`` is the attempt this
    worker holds (0 before it claimed one: only the entry is then checked)."""
    error = encode_event(ErrorEvent(attempt=event_attempt, seq=seq, code=code, message=message))["data"]
    fields = {**records.info_error(code, message), "finished_at": repr(time.time())}
    dead = records.DeadLetter(job=raw, job_id=job_id or "", entry_id=entry_id, code=code, reason=message,
                              attempts=event_attempt, worker=ctx.consumer, failed_at=time.time())
    tenant, route = completion_events.payload_facts(raw)
    completion = completion_events.job_record(job_id or "", tenant, records.ERROR, code, route)
    return transitions.fail(b, stream=lane.stream, dlq=lane.dlq, entry_id=entry_id, consumer=ctx.consumer, attempt=attempt,
                            job_id=job_id, error_data=error, fields=fields,
                            dead=dead.redacted() if ctx.dlq_redact else dead, dlq_maxlen=ctx.dlq_maxlen,
                            ttl_after_done=ctx.reply_ttl, reply_maxlen=ctx.reply_maxlen, completion=completion)
