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

from schemas import transitions
from schemas.redis_errors import REFUSING_WRITES, UNAVAILABLE
from schemas.text import as_str

from gpuworker.service.context import WorkerContext
from gpuworker.service.messages import DropJob
from gpuworker.service.state import InFlight

QUEUE_GAUGE_INTERVAL = 2.0


class LeaseKeeper(threading.Thread):
    def __init__(self, ctx: WorkerContext, r: redis.Redis, inflight: InFlight, requeue: Callable[[list], None],
                 to_engine, metrics, log, stop: threading.Event, reap: Callable[[], bool] = lambda: True,
                 identity=None, on_identity_lost: Callable[[], None] = lambda: None):
        super().__init__(name="inferq-lease", daemon=True)
        self.ctx, self.r, self.inflight = ctx, r, inflight
        self.requeue, self.to_engine, self.metrics, self.log = requeue, to_engine, metrics, log
        self.stop = stop
        self.reap_enabled = reap  # false while draining: take no new work
        self.identity = identity  # WorkerIdentity: renewed with the heartbeat
        self.on_identity_lost = on_identity_lost
        self.tick_s = min(ctx.lease_seconds / 3.0, 2.0)
        self.min_idle_ms = int(3 * ctx.lease_seconds * 1000)
        self._cursor = "0-0"
        self._last_reap = 0.0
        self._last_gauges = 0.0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.tick()
            except UNAVAILABLE as e:
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
        if self.identity is not None and not self.identity.renew(self.r):
            # We stalled past the id's TTL and another process took the id: two
            # workers must never share a consumer name, so this one stops.
            self.log.error("worker_id_taken_over", worker_id=self.ctx.consumer)
            self.on_identity_lost()

    def refresh(self) -> None:
        held = [st for st in self.inflight.snapshot() if st.is_active]
        if not held:
            return
        # One atomic script: renews only what is still ours, so it can never take
        # an entry back from a worker that just reclaimed it.
        lost = set(transitions.renew(self.r, model=self.ctx.model, consumer=self.ctx.consumer,
                                     entry_ids=[st.entry_id for st in held]))
        for st in held:
            if st.entry_id in lost and self.inflight.get(st.id) is st and st.drop():
                st.log.warning("lease_lost", entry_id=st.entry_id)
                self.to_engine.put(DropJob(st.id))

    def reap(self) -> int:
        free = self.inflight.free()
        if free <= 0:
            return 0
        resp = self.r.xautoclaim(self.ctx.stream, self.ctx.group, self.ctx.consumer, self.min_idle_ms,
                                 start_id=self._cursor, count=free)
        self._cursor = as_str(resp[0])
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
        # Dead letters past their age go (the count cap is applied as they are written).
        pipe.xtrim(self.ctx.dlq, minid=f"{int((time.time() - self.ctx.dlq_max_age_s) * 1000)}-0", approximate=True)
        depth, pend, dlq, _ = pipe.execute(raise_on_error=False)
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
        """Hand the entries still ours back to the group for another worker's next reap."""
        transitions.hand_back(self.r, model=self.ctx.model, consumer=self.ctx.consumer, entry_ids=entry_ids,
                              idle_ms=self.min_idle_ms + 1000)

    def leave(self) -> None:
        self.r.zrem(self.ctx.workers_key, self.ctx.consumer)
