"""Publisher thread: turns engine outputs into reply-stream writes, one
pipeline (one round trip, one MULTI) per engine step. While it writes step k
the engine computes step k+1; if it falls behind, up to ``max_flush_steps``
queued steps share one pipeline, and with ``coalesce`` a job's deltas inside
one pipeline are merged into one event.

The same round trip reads the cancel flag of every job in flight, so a
cancel is seen within one step."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import redis

from inferq.schemas import Usage, transitions
from inferq.schemas.job import JOB_FIELD

from inferq.gpuworker.service import replies
from inferq.gpuworker.service.batch import Batch
from inferq.gpuworker.service.context import WorkerContext
from inferq.gpuworker.service.embed_jobs import encode_embedding
from inferq.gpuworker.service.messages import STOP, AbortJob, Dropped, DropJob, Failed, Rejected, Started, Stop, StepOutput
from inferq.gpuworker.service.state import InFlight, JobState

__all__ = ["Publisher", "STOP"]


@dataclass
class _Coalesced:
    """A job's deltas merged within one pipeline (``coalesce``)."""

    st: JobState
    text: str = ""
    token_ids: list = field(default_factory=list)
    logprobs: Optional[list] = None
    prompt_logprobs: Optional[list] = None  # the attempt's first delta carries them


class _Round:
    """What one flush collects before its single round trip."""

    def __init__(self) -> None:
        self.b = Batch()
        self.n_events = 0
        self.finished: list[JobState] = []  # final pipeline written: leave the in-flight set
        self.retry: list[tuple[JobState, str]] = []  # attempt over after an engine fault: read again
        self.dropped: list[tuple[str, bool]] = []  # (job id, hand back to the group)
        self.pending: dict[str, _Coalesced] = {}
        self.fenced: list[tuple[JobState, str, int]] = []  # (job, op, index of the script's answer)


class Publisher(threading.Thread):
    def __init__(self, ctx: WorkerContext, r: redis.Redis, inflight: InFlight, items: "queue.Queue",
                 to_engine: "queue.Queue", requeue: Callable[..., None], metrics, log, *,
                 coalesce: bool = False, max_flush_steps: int = 8, give_up: Callable[[], bool] = lambda: False):
        super().__init__(name="inferq-publisher", daemon=True)
        self.ctx, self.r, self.inflight, self.items = ctx, r, inflight, items
        self.to_engine, self.requeue, self.metrics, self.log = to_engine, requeue, metrics, log
        self.coalesce = coalesce
        self.max_flush_steps = max_flush_steps
        self.give_up = give_up
        self.error: Optional[BaseException] = None
        self.flushes = 0
        self.events_written = 0
        self.handed_back: list = []  # (lane, entry id) of jobs the drain gave up on
        self._handlers = {Started: self._on_started, StepOutput: self._on_step, Rejected: self._on_rejected,
                          Failed: self._on_failed, Dropped: self._on_dropped}

    def run(self) -> None:
        try:
            while True:
                item = self.items.get()
                batch, stop = [], False
                while item is not None:
                    if isinstance(item, Stop):
                        stop = True
                        break
                    batch.append(item)
                    if len(batch) >= self.max_flush_steps:
                        break
                    try:
                        item = self.items.get_nowait()
                    except queue.Empty:
                        item = None
                if batch:
                    self.flush(batch)
                if stop:
                    return
        except BaseException as e:
            self.error = e
            self.log.exception("publisher_crashed")

    # -- one round trip ----------------------------------------------------------
    def flush(self, items: list) -> None:
        rnd = _Round()
        for item in items:
            self._handlers[type(item)](rnd, item)
        for job_id in list(rnd.pending):
            self._write_pending(rnd, job_id)
        self._send(rnd)

    # -- one handler per message kind ----------------------------------------------
    def _on_started(self, rnd: _Round, item: Started) -> None:
        for st in item.states:
            if st.is_active:
                rnd.fenced.append((st, "start", replies.start(rnd.b, self.ctx, st)))
                rnd.n_events += 2 if st.attempt > 1 else 1

    def _on_step(self, rnd: _Round, item: StepOutput) -> None:
        self.metrics.update_engine(item.stats)
        if item.step_s:
            self.metrics.step_time.observe(item.step_s)
        for d in item.deltas:
            st = self.inflight.get(d.request_id)
            if st is None or not st.is_active:
                continue
            if d.new_token_ids:
                self._observe_token(st, item.t)
            if d.new_text or d.new_token_ids or d.choice_end:
                self._add_delta(rnd, st, d)
            if d.finished:
                self._write_pending(rnd, st.id)
                if st.begin_finish():
                    self._finish(rnd, st, d, item.t)

    def _on_rejected(self, rnd: _Round, item: Rejected) -> None:
        st = item.st
        if not st.is_active:
            return
        self._write_pending(rnd, st.id)
        if st.begin_finish():
            self._fail(rnd, st, item.code, item.message)

    def _on_failed(self, rnd: _Round, item: Failed) -> None:
        for st in item.states:
            if not st.begin_finish():  # dropped, or its final pipeline is already written
                continue
            rnd.pending.pop(st.id, None)  # this attempt is over: its unsent deltas are moot
            # Blamed: the job on probation, or everyone when nobody was.
            blamed = item.culprit is None or st.id == item.culprit
            if blamed and st.attempt >= self.ctx.max_deliveries:
                self._fail(rnd, st, "engine_error",
                           f"generation failed on {st.attempt} attempts; last error: {item.error}")
            else:
                flag = "culprit" if st.id == item.culprit else ("suspect" if item.culprit is None else "")
                rnd.retry.append((st, flag))

    def _on_dropped(self, rnd: _Round, item: Dropped) -> None:
        rnd.dropped.extend((job_id, item.handback) for job_id in item.ids)

    # -- pieces ------------------------------------------------------------------
    def _observe_token(self, st: JobState, t: float) -> None:
        if st.first_token_at is None:
            st.first_token_at = t
            self.metrics.ttft.observe(max(0.0, t - st.created))
        elif st.last_token_at is not None:
            self.metrics.itl.observe(max(0.0, t - st.last_token_at))
        st.last_token_at = t

    def _add_delta(self, rnd: _Round, st: JobState, d) -> None:
        if st.job.sampling.n > 1:  # several choices: each delta names its choice (never merged)
            replies.add_delta(rnd.b, self.ctx, st, d.new_text, d.new_token_ids, d.logprobs, d.prompt_logprobs,
                              index=d.index, finish_reason=d.choice_end)
            rnd.n_events += 1
            return
        if not self.coalesce:
            replies.add_delta(rnd.b, self.ctx, st, d.new_text, d.new_token_ids, d.logprobs, d.prompt_logprobs)
            rnd.n_events += 1
            return
        c = rnd.pending.setdefault(st.id, _Coalesced(st))
        c.text += d.new_text
        c.token_ids.extend(d.new_token_ids)
        if d.logprobs is not None:
            c.logprobs = (c.logprobs or []) + list(d.logprobs)
        if d.prompt_logprobs is not None:
            c.prompt_logprobs = d.prompt_logprobs

    def _write_pending(self, rnd: _Round, job_id: str) -> None:
        c = rnd.pending.pop(job_id, None)
        if c:
            replies.add_delta(rnd.b, self.ctx, c.st, c.text, c.token_ids, c.logprobs, c.prompt_logprobs)
            rnd.n_events += 1

    def _finish(self, rnd: _Round, st: JobState, d, t: float) -> None:
        usage = Usage(prompt_tokens=d.num_prompt_tokens, completion_tokens=d.num_output_tokens,
                      cached_tokens=d.num_cached_tokens)
        embedding = None if d.embedding is None else encode_embedding(d.embedding)
        rnd.fenced.append((st, "finish", replies.finish(rnd.b, self.ctx, st, d.finish_reason, usage, now=t,
                                                                 choices=d.choices, embedding=embedding)))
        rnd.n_events += 1
        rnd.finished.append(st)
        self.metrics.finished(d.finish_reason)
        self.metrics.e2e.observe(max(0.0, t - st.created))
        st.log.info("job_finished", finish_reason=d.finish_reason,
                    completion_tokens=d.num_output_tokens, cached_tokens=d.num_cached_tokens)

    def _fail(self, rnd: _Round, st: JobState, code: str, message: str) -> None:
        self.metrics.error(code)
        st.log.warning("job_failed", code=code, reason=message)
        idx = replies.fail(rnd.b, self.ctx, lane=st.lane, entry_id=st.entry_id, raw=st.raw, job_id=st.id, attempt=st.attempt,
                           event_attempt=st.attempt, seq=st.next_seq(), code=code, message=message)
        rnd.fenced.append((st, "fail", idx))
        rnd.n_events += 1
        rnd.finished.append(st)

    def _send(self, rnd: _Round) -> None:
        """The round trip, then what it settled: cancels, removals, hand-backs, retries."""
        b = rnd.b
        # The per-step cancel check rides on the same round trip.
        watch = [st for st in self.inflight.snapshot() if st.is_active and not st.cancel_requested]
        idx = [b.exists(st.cancel_key) for st in watch]

        t0 = time.perf_counter()
        res = b.send(self.r, give_up=self.give_up, log=self.log)
        self.metrics.publish_time.observe(time.perf_counter() - t0)
        self.metrics.reply_events.inc(rnd.n_events)
        self.flushes += 1
        self.events_written += rnd.n_events
        for r_ in res:
            if isinstance(r_, Exception):
                self.log.error("reply_write_failed", error=str(r_))

        self._settle_fenced(rnd, res)
        for st, i in zip(watch, idx):
            if res[i]:
                st.cancel_requested = True
                st.log.info("job_cancel_requested")
                self.to_engine.put(AbortJob(st.id, "abort"))
        for st in rnd.finished:
            self.inflight.remove(st.id)
        for job_id, handback in rnd.dropped:
            st = self.inflight.remove(job_id)
            if st is not None:
                st.drop()
                if handback:
                    self.handed_back.append((st.lane, st.entry_id))
        for st, flag in rnd.retry:
            self.inflight.remove(st.id)
            raw = st.raw if isinstance(st.raw, bytes) else st.raw.encode("utf-8")
            self.requeue(st.lane, [(st.entry_id, {JOB_FIELD.encode(): raw})], flag)
        self.metrics.inflight.set(len(self.inflight))

    def _settle_fenced(self, rnd: _Round, res: list) -> None:
        """A state change Redis refused means another worker owns the job now
        (this one lost its lease): nothing was written; count it, log it, and
        stop working on the job if it is still running here."""
        for st, op, i in rnd.fenced:
            answer = res[i]
            if answer == transitions.REFUSED:
                self.metrics.refused(op)
                st.log.warning("state_change_refused", op=op, entry_id=st.entry_id,
                               reason="this worker no longer owns the job (lease lost)")
                if op == "start" and st.drop():
                    self.to_engine.put(DropJob(st.id))
                    rnd.dropped.append((st.id, False))
