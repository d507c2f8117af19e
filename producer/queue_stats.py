"""Queue depth, lag, pending, DLQ size and live workers per model, read from Redis.

Shared by `inferq status`, the gateway's /metrics and the Celery export task.
The job stream keeps only unfinished jobs (workers XDEL what they finish), so
waiting (not yet delivered) = depth - pending, on any Redis version.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from schemas import keys
from schemas.text import as_str


def discover_models(r) -> list[str]:
    found: set[str] = set()
    for kind in ("jobs", "workers", "dlq"):
        for key in r.scan_iter(match=keys.pattern(kind), count=500):
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
class ModelQueueStats:
    model: str
    depth: int  # entries on the job stream: waiting + in flight
    waiting: int  # not yet delivered to any worker (consumer lag)
    pending: int  # delivered, not yet acked
    dlq: int
    oldest_waiting_s: Optional[float]  # age of the oldest undelivered job
    workers: list[WorkerInfo] = field(default_factory=list)

    @property
    def workers_alive(self) -> int:
        return sum(1 for w in self.workers if w.alive)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["workers_alive"] = self.workers_alive
        return d


def live_workers(r, model: str, stale_s: float, now: Optional[float] = None) -> list[WorkerInfo]:
    now = time.time() if now is None else now
    out = []
    for name, score in r.zrange(keys.workers(model), 0, -1, withscores=True):
        age = max(0.0, now - float(score))
        out.append(WorkerInfo(as_str(name), round(age, 3), age <= stale_s))
    return out


def model_stats(r, model: str, stale_s: float = 15.0) -> ModelQueueStats:
    stream = keys.jobs(model)
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
    return ModelQueueStats(
        model=model, depth=depth, waiting=waiting, pending=pending,
        dlq=int(r.xlen(keys.dlq(model))), oldest_waiting_s=oldest,
        workers=live_workers(r, model, stale_s),
    )


def all_stats(r, stale_s: float = 15.0, models: Optional[list[str]] = None) -> list[ModelQueueStats]:
    return [model_stats(r, m, stale_s) for m in (models or discover_models(r))]
