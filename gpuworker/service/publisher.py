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
from typing import Callable, Optional

import redis

from schemas import Usage, keys

from gpuworker.service import replies
from gpuworker.service.batch import Batch
from gpuworker.service.context import WorkerContext
from gpuworker.service.engine_loop import Dropped, Failed, Rejected, Started, StepOutput
from gpuworker.service.state import InFlight, JobState

STOP = object()


class Publisher(threading.Thread):
    def __init__(self, ctx: WorkerContext, r: redis.Redis, inflight: InFlight, items: "queue.Queue",
                 to_engine: "queue.Queue", requeue: Callable[[list], None], metrics, log, *,
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
        self.handed_back: list[str] = []  # entry ids the drain gave up on

    def run(self) -> None:
        try:
            while True:
                item = self.items.get()
                batch, stop = [], False
                while item is not None:
                    if item is STOP:
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
        b = Batch()
        finished: list[JobState] = []
        retry: list[tuple[JobState, str]] = []
        dropped: list[tuple[str, bool]] = []
        pending: dict[str, list] = {}  # coalesced deltas: job id -> [state, text, ids, logprobs, prompt logprobs]
        n_events = 0

        def write_pending(job_id: str) -> None:
            nonlocal n_events
            p = pending.pop(job_id, None)
            if p:
                st, text, ids, lps, plp = p
                replies.add_delta(b, self.ctx, st, text, ids, lps, plp)
                n_events += 1

        for item in items:
            if isinstance(item, Started):
                for st in item.states:
                    if not (st.dropped or st.finishing):
                        replies.start(b, self.ctx, st)
                        n_events += 2 if st.attempt > 1 else 1
            elif isinstance(item, StepOutput):
                self.metrics.update_engine(item.stats)
                if item.step_s:
                    self.metrics.step_time.observe(item.step_s)
                for d in item.deltas:
                    st = self.inflight.get(d.request_id)
                    if st is None or st.dropped or st.finishing:
                        continue
                    if d.new_token_ids:
                        if st.first_token_at is None:
                            st.first_token_at = item.t
                            self.metrics.ttft.observe(max(0.0, item.t - st.created))
                        elif st.last_token_at is not None:
                            self.metrics.itl.observe(max(0.0, item.t - st.last_token_at))
                        st.last_token_at = item.t
                    if d.new_text or d.new_token_ids:
                        if self.coalesce:
                            p = pending.setdefault(st.id, [st, "", [], None, None])
                            p[1] += d.new_text
                            p[2].extend(d.new_token_ids)
                            if d.logprobs is not None:
                                p[3] = (p[3] or []) + list(d.logprobs)
                            if d.prompt_logprobs is not None:
                                p[4] = d.prompt_logprobs
                        else:
                            replies.add_delta(b, self.ctx, st, d.new_text, d.new_token_ids, d.logprobs,
                                              d.prompt_logprobs)
                            n_events += 1
                    if d.finished:
                        write_pending(st.id)
                        st.finishing = True
                        usage = Usage(prompt_tokens=d.num_prompt_tokens, completion_tokens=d.num_output_tokens,
                                      cached_tokens=d.num_cached_tokens)
                        replies.finish(b, self.ctx, st, d.finish_reason, usage, now=item.t)
                        n_events += 1
                        finished.append(st)
                        self.metrics.finished(d.finish_reason)
                        self.metrics.e2e.observe(max(0.0, item.t - st.created))
                        st.log.info("job_finished", finish_reason=d.finish_reason,
                                    completion_tokens=d.num_output_tokens, cached_tokens=d.num_cached_tokens)
            elif isinstance(item, Rejected):
                st = item.st
                if st.dropped or st.finishing:
                    continue
                write_pending(st.id)
                st.finishing = True
                self._fail(b, st, item.code, item.message)
                n_events += 1
                finished.append(st)
            elif isinstance(item, Failed):
                for st in item.states:
                    if st.dropped or st.finishing:
                        continue
                    pending.pop(st.id, None)
                    st.finishing = True  # this attempt is over
                    # Blamed: the job on probation, or everyone when nobody was.
                    blamed = item.culprit is None or st.id == item.culprit
                    if blamed and st.attempt >= self.ctx.max_deliveries:
                        self._fail(b, st, "engine_error",
                                   f"generation failed on {st.attempt} attempts; last error: {item.error}")
                        n_events += 1
                        finished.append(st)
                    else:
                        flag = "culprit" if st.id == item.culprit else ("suspect" if item.culprit is None else "")
                        retry.append((st, flag))
            elif isinstance(item, Dropped):
                dropped.extend((job_id, item.handback) for job_id in item.ids)
        for job_id in list(pending):
            write_pending(job_id)

        # The per-step cancel check rides on the same round trip.
        watch = [st for st in self.inflight.snapshot() if not (st.finishing or st.cancel_requested or st.dropped)]
        idx = [b.exists(keys.cancel(st.id)) for st in watch]

        t0 = time.perf_counter()
        res = b.send(self.r, give_up=self.give_up, log=self.log)
        self.metrics.publish_time.observe(time.perf_counter() - t0)
        self.metrics.reply_events.inc(n_events)
        self.flushes += 1
        self.events_written += n_events
        for r_ in res:
            if isinstance(r_, Exception):
                self.log.error("reply_write_failed", error=str(r_))

        for st, i in zip(watch, idx):
            if res[i]:
                st.cancel_requested = True
                st.log.info("job_cancel_requested")
                self.to_engine.put(("abort", st.id, "abort"))
        for st in finished:
            self.inflight.remove(st.id)
        for job_id, handback in dropped:
            st = self.inflight.remove(job_id)
            if st is not None:
                st.dropped = True
                if handback:
                    self.handed_back.append(st.entry_id)
        for st, flag in retry:
            self.inflight.remove(st.id)
            raw = st.raw if isinstance(st.raw, bytes) else st.raw.encode("utf-8")
            self.requeue([(st.entry_id, {b"job": raw})], flag)
        self.metrics.inflight.set(len(self.inflight))

    def _fail(self, b: Batch, st: JobState, code: str, message: str) -> None:
        self.metrics.error(code)
        st.log.warning("job_failed", code=code, reason=message)
        replies.fail(b, self.ctx, entry_id=st.entry_id, raw=st.raw, job_id=st.id, attempt=st.attempt,
                     seq=st.next_seq(), code=code, message=message)
