"""Queue depth, lag, pending, DLQ size and live workers per model, read from Redis.

Shared by `inferq status`, the gateway's /metrics and the Celery export task.
A model's queue is one or more lanes (schemas/queues.py: partitions, priority
classes, fair-share tenants); the numbers are summed over them and also given
per class and per tenant lane. Each lane's stream keeps only unfinished jobs
(workers XDEL what they finish), so waiting (not yet delivered) = depth -
pending, on any Redis version.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from inferq.schemas import keys
from inferq.schemas.queues import Lane, lanes_of, models_of_keys
from inferq.schemas.text import as_str


def discover_models(r) -> list[str]:
    found: set[str] = set()
    for kind in ("jobs", "lanes", "dlq"):
        found |= models_of_keys(r.scan_iter(match=keys.pattern(kind), count=500))
    for key in r.scan_iter(match=keys.pattern("workers"), count=500):
        m = keys.tag_of(as_str(key))
        if m:
            found.add(m)
    return sorted(found)


@dataclass
class WorkerInfo:
    name: str
    last_heartbeat_age_s: float
    alive: bool


@dataclass
class LaneStats:
    cls: str
    tenant: str
    partition: int
    depth: int
    waiting: int
    pending: int
    oldest_waiting_s: Optional[float]


@dataclass
class ModelQueueStats:
    model: str
    depth: int  # entries on the job stream: waiting + in flight
    waiting: int  # not yet delivered to any worker (consumer lag)
    pending: int  # delivered, not yet acked
    dlq: int
    oldest_waiting_s: Optional[float]  # age of the oldest undelivered job
    workers: list[WorkerInfo] = field(default_factory=list)
    lanes: list[LaneStats] = field(default_factory=list)

    @property
    def workers_alive(self) -> int:
        return sum(1 for w in self.workers if w.alive)

    def totals(self, by: str) -> dict[str, dict[str, int]]:
        """waiting/pending per priority class (``by="cls"``) or tenant lane (``by="tenant"``)."""
        out: dict[str, dict[str, int]] = {}
        for ln in self.lanes:
            row = out.setdefault(getattr(ln, by) or "-", {"waiting": 0, "pending": 0})
            row["waiting"] += ln.waiting
            row["pending"] += ln.pending
        return out

    def as_dict(self) -> dict:
        d = asdict(self)
        d["workers_alive"] = self.workers_alive
        d["by_class"] = self.totals("cls")
        d["by_tenant"] = self.totals("tenant")
        return d


def live_workers(r, model: str, stale_s: float, now: Optional[float] = None) -> list[WorkerInfo]:
    now = time.time() if now is None else now
    out = []
    for name, score in r.zrange(keys.workers(model), 0, -1, withscores=True):
        age = max(0.0, now - float(score))
        out.append(WorkerInfo(as_str(name), round(age, 3), age <= stale_s))
    return out


def lane_stats(r, lane: Lane) -> LaneStats:
    stream = lane.stream
    depth = int(r.xlen(stream))
    pending, last_delivered = 0, "0-0"
    if depth:
        try:
            for g in r.xinfo_groups(stream):
                if as_str(g.get("name", g.get(b"name", ""))) == keys.JOBS_GROUP:
                    pending = int(g.get("pending", 0))
                    last_delivered = as_str(g.get("last-delivered-id", "0-0"))
        except Exception as e:  # no group yet: no worker ever attached
            if "no such key" not in str(e).lower():
                raise
    waiting = max(0, depth - pending)
    oldest = None
    if waiting:
        nxt = r.xrange(stream, min=f"({last_delivered}", max="+", count=1)
        if nxt:
            ms = int(as_str(nxt[0][0]).split("-")[0])
            oldest = round(max(0.0, time.time() - ms / 1000.0), 3)
    return LaneStats(lane.cls, lane.tenant, lane.partition, depth, waiting, pending, oldest)


def model_stats(r, model: str, stale_s: float = 15.0) -> ModelQueueStats:
    lanes = [lane_stats(r, ln) for ln in lanes_of(r, model)]
    ages = [ln.oldest_waiting_s for ln in lanes if ln.oldest_waiting_s is not None]
    dlq = sum(int(r.xlen(keys.dlq(model, p))) for p in range(keys.partitions()))
    return ModelQueueStats(
        model=model, depth=sum(ln.depth for ln in lanes), waiting=sum(ln.waiting for ln in lanes),
        pending=sum(ln.pending for ln in lanes), dlq=dlq, oldest_waiting_s=max(ages) if ages else None,
        workers=live_workers(r, model, stale_s), lanes=lanes,
    )


def all_stats(r, stale_s: float = 15.0, models: Optional[list[str]] = None) -> list[ModelQueueStats]:
    return [model_stats(r, m, stale_s) for m in (models or discover_models(r))]
