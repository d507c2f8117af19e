"""Lease thread: heartbeat, lease refresh, reaper and queue gauges.

- Heartbeat: ZADD inferq:workers:{model} <now> <worker> every tick, so the
  gateway can tell which models have live workers.
- Lease: the idle time of this worker's in-flight entries is reset with
  ``XCLAIM ... JUSTID`` (which does not bump the delivery count). An entry
  that another worker has claimed meanwhile is dropped here: its new owner
  regenerates it.
- Reaper: ``XAUTOCLAIM`` with min-idle = 3 leases moves entries of dead
  workers to this one (up to its free capacity), following a cursor per lane,
  on every lane of the model (all partitions: a dead worker's jobs are
  anyone's).
- Release on shutdown: entries this worker could not finish are marked idle
  past the reaper's threshold (``XCLAIM ... IDLE``), so another worker takes
  them at its next reap instead of waiting three leases.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import redis

from inferq.schemas import keys, transitions
from inferq.schemas.queues import Lane, lanes_of
from inferq.schemas.redis_errors import REFUSING_WRITES, UNAVAILABLE
from inferq.schemas.text import as_str

from inferq.gpuworker.service.context import WorkerContext
from inferq.gpuworker.service.messages import DropJob
from inferq.gpuworker.service.state import InFlight

QUEUE_GAUGE_INTERVAL = 2.0


class LeaseKeeper(threading.Thread):
    def __init__(self, ctx: WorkerContext, r: redis.Redis, inflight: InFlight, requeue: Callable[..., None],
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
        self._cursors: dict[Lane, str] = {}
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
        pipe.expire(keys.model_info(self.ctx.model), keys.MODEL_INFO_TTL_S)
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
        # One atomic script per lane: renews only what is still ours, so it can
        # never take an entry back from a worker that just reclaimed it.
        by_lane: dict[Lane, list] = {}
        for st in held:
            by_lane.setdefault(st.lane, []).append(st)
        lost: set = set()
        for lane, sts in by_lane.items():
            gone = transitions.renew(self.r, stream=lane.stream, consumer=self.ctx.consumer,
                                     entry_ids=[st.entry_id for st in sts])
            lost.update((lane, eid) for eid in gone)
        for st in held:
            if (st.lane, st.entry_id) in lost and self.inflight.get(st.id) is st and st.drop():
                st.log.warning("lease_lost", entry_id=st.entry_id)
                self.to_engine.put(DropJob(st.id))

    def reap(self) -> int:
        total = 0
        for lane in lanes_of(self.r, self.ctx.model):
            free = self.inflight.free()
            if free <= 0:
                break
            try:
                resp = self.r.xautoclaim(lane.stream, self.ctx.group, self.ctx.consumer, self.min_idle_ms,
                                         start_id=self._cursors.get(lane, "0-0"), count=free)
            except redis.ResponseError as e:
                if "NOGROUP" in str(e):
                    continue  # a lane no job has reached yet
                raise
            self._cursors[lane] = as_str(resp[0])
            claimed = [(eid, fields) for eid, fields in resp[1]]
            if claimed:
                self.metrics.reclaimed.inc(len(claimed))
                self.log.info("reclaimed_idle_entries", count=len(claimed), stream=lane.stream)
                self.requeue(lane, claimed)
                total += len(claimed)
        return total

    def queue_gauges(self) -> None:
        lanes = lanes_of(self.r, self.ctx.model)
        dlqs = [keys.dlq(self.ctx.model, p) for p in range(keys.partitions())]
        pipe = self.r.pipeline(transaction=False)
        for lane in lanes:
            pipe.xlen(lane.stream)
            pipe.xpending(lane.stream, self.ctx.group)
        min_id = f"{int((time.time() - self.ctx.dlq_max_age_s) * 1000)}-0"
        for dlq in dlqs:
            pipe.xlen(dlq)
            # Dead letters past their age go (the count cap is applied as they are written).
            pipe.xtrim(dlq, minid=min_id, approximate=True)
        res = pipe.execute(raise_on_error=False)
        depth = n_pending = 0
        for i in range(len(lanes)):
            d, pend = res[2 * i], res[2 * i + 1]
            depth += d if isinstance(d, int) else 0
            n_pending += pend.get("pending", 0) if isinstance(pend, dict) else 0
        self.metrics.queue_depth.set(depth)
        self.metrics.pending.set(n_pending)
        # Finished entries are deleted, so the streams hold exactly the
        # undelivered plus the pending ones (works on Redis < 7 too).
        self.metrics.consumer_lag.set(max(0, depth - n_pending))
        tail = res[2 * len(lanes):]
        self.metrics.dlq_size.set(sum(x for x in tail[0::2] if isinstance(x, int)))
        self.metrics.inflight.set(len(self.inflight))

    def release(self, entries: list[tuple[Lane, str]]) -> None:
        """Hand the entries still ours back to the group for another worker's next reap."""
        by_lane: dict[Lane, list] = {}
        for lane, eid in entries:
            by_lane.setdefault(lane, []).append(eid)
        for lane, eids in by_lane.items():
            transitions.hand_back(self.r, stream=lane.stream, consumer=self.ctx.consumer, entry_ids=eids,
                                  idle_ms=self.min_idle_ms + 1000)

    def leave(self) -> None:
        self.r.zrem(self.ctx.workers_key, self.ctx.consumer)
