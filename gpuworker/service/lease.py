"""Lease thread: heartbeat, lease refresh, reaper and queue gauges.

- Heartbeat: ZADD inferq:workers:{model} <now> <worker> every tick, so the
  gateway can tell which models have live workers.
- Lease: the idle time of this worker's in-flight entries is reset with
  ``XCLAIM ... JUSTID`` (which does not bump the delivery count). An entry
  that another worker has claimed meanwhile is dropped here: its new owner
  regenerates it.
- Reaper: ``XAUTOCLAIM`` with min-idle = 3 leases moves entries of dead
  workers to this one (up to its free capacity), following the cursor.
- Release on shutdown: entries this worker could not finish are marked idle
  past the reaper's threshold (``XCLAIM ... IDLE``), so another worker takes
  them at its next reap instead of waiting three leases.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import redis

from gpuworker.service.batch import REFUSING_WRITES
from gpuworker.service.context import WorkerContext
from gpuworker.service.state import InFlight

QUEUE_GAUGE_INTERVAL = 2.0


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class LeaseKeeper(threading.Thread):
    def __init__(self, ctx: WorkerContext, r: redis.Redis, inflight: InFlight, requeue: Callable[[list], None],
                 to_engine, metrics, log, stop: threading.Event, reap: Callable[[], bool] = lambda: True):
        super().__init__(name="inferq-lease", daemon=True)
        self.ctx, self.r, self.inflight = ctx, r, inflight
        self.requeue, self.to_engine, self.metrics, self.log = requeue, to_engine, metrics, log
        self.stop = stop
        self.reap_enabled = reap  # false while draining: take no new work
        self.tick_s = min(ctx.lease_seconds / 3.0, 2.0)
        self.min_idle_ms = int(3 * ctx.lease_seconds * 1000)
        self._cursor = "0-0"
        self._last_reap = 0.0
        self._last_gauges = 0.0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.tick()
            except (redis.ConnectionError, redis.TimeoutError) as e:
                self.log.warning("redis_unavailable_retrying", op="lease", error=str(e))
            except REFUSING_WRITES as e:
                self.log.warning("redis_refusing_writes_retrying", op="lease", error=str(e))
            except Exception:
                self.log.exception("lease_tick_failed")
            self.stop.wait(self.tick_s)

    def tick(self) -> None:
        now = time.time()
        self.heartbeat(now)
        self.refresh()
        if self.reap_enabled() and now - self._last_reap >= self.ctx.lease_seconds:
            self._last_reap = now
            self.reap()
        if now - self._last_gauges >= QUEUE_GAUGE_INTERVAL:
            self._last_gauges = now
            self.queue_gauges()

    def heartbeat(self, now: Optional[float] = None) -> None:
        now = now or time.time()
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(self.ctx.workers_key, {self.ctx.consumer: now})
        # Forget workers silent for an hour (killed ones never say goodbye).
        pipe.zremrangebyscore(self.ctx.workers_key, "-inf", now - 3600)
        pipe.execute()

    def refresh(self) -> None:
        held = [st for st in self.inflight.snapshot() if not (st.finishing or st.dropped)]
        if not held:
            return
        rows = self.r.xpending_range(self.ctx.stream, self.ctx.group, min="-", max="+",
                                     count=max(1000, 4 * len(held)), consumername=self.ctx.consumer)
        owned = {_s(row["message_id"]) for row in rows}
        mine = [st.entry_id for st in held if st.entry_id in owned]
        if mine:
            self.r.xclaim(self.ctx.stream, self.ctx.group, self.ctx.consumer, 0, mine, justid=True)
        for st in held:
            if st.entry_id not in owned and not (st.finishing or st.dropped) and self.inflight.get(st.id) is st:
                st.log.warning("lease_lost", entry_id=st.entry_id)
                st.dropped = True
                self.to_engine.put(("drop", st.id))

    def reap(self) -> int:
        free = self.inflight.free()
        if free <= 0:
            return 0
        resp = self.r.xautoclaim(self.ctx.stream, self.ctx.group, self.ctx.consumer, self.min_idle_ms,
                                 start_id=self._cursor, count=free)
        self._cursor = _s(resp[0])
        claimed = [(eid, fields) for eid, fields in resp[1]]
        if claimed:
            self.metrics.reclaimed.inc(len(claimed))
            self.log.info("reclaimed_idle_entries", count=len(claimed))
            self.requeue(claimed)
        return len(claimed)

    def queue_gauges(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.xlen(self.ctx.stream)
        pipe.xpending(self.ctx.stream, self.ctx.group)
        pipe.xlen(self.ctx.dlq)
        depth, pend, dlq = pipe.execute(raise_on_error=False)
        if isinstance(depth, int):
            self.metrics.queue_depth.set(depth)
            n_pending = pend.get("pending", 0) if isinstance(pend, dict) else 0
            self.metrics.pending.set(n_pending)
            # Finished entries are deleted, so the stream holds exactly the
            # undelivered plus the pending ones (works on Redis < 7 too).
            self.metrics.consumer_lag.set(max(0, depth - n_pending))
        if isinstance(dlq, int):
            self.metrics.dlq_size.set(dlq)
        self.metrics.inflight.set(len(self.inflight))

    def release(self, entry_ids: list[str]) -> None:
        """Hand entries back to the group for another worker's next reap."""
        if entry_ids:
            self.r.xclaim(self.ctx.stream, self.ctx.group, self.ctx.consumer, 0, entry_ids,
                          idle=self.min_idle_ms + 1000, justid=True)

    def leave(self) -> None:
        self.r.zrem(self.ctx.workers_key, self.ctx.consumer)
