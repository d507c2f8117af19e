"""Queue housekeeping that needs no model: run by Celery beat (or by hand).

Workers reap and dead-letter on their own while any is alive; these tasks keep
the queue tidy when none is, and export numbers for dashboards:

- reclaim_stale: entries idle past 3 leases on consumers with no heartbeat move
  to a live consumer (XCLAIM JUSTID: the delivery count is not bumped) and stay
  idle, so the live workers' reapers take them at once; emptied dead consumers
  are removed from the group.
- dead_letter_exceeded: entries delivered max_deliveries times or more go to the
  DLQ (copy, error event, then ack + delete, in one MULTI).
- expire_finished_replies: reply streams and job records of finished jobs that
  lost their TTL get one again.
- export_stats: depth, lag, pending, DLQ and workers per model into
  ``inferq:stats:{model}`` hashes.
"""
from __future__ import annotations

import json
import time
from typing import Optional

from pydantic import Field

from inferq.schemas import ErrorEvent, completion_events, encode_event, keys, records, transitions
from inferq.schemas.job import job_payload
from inferq.schemas.policy import QueuePolicy
from inferq.schemas.queues import Lane, lanes_of
from inferq.schemas.text import as_str
from inferq.schemas.events import TERMINAL_TYPES
from inferq.producer.queue_stats import all_stats, discover_models


class MaintenanceSettings(QueuePolicy):
    """The queue policy the workers use, plus how long exported stats live."""

    stats_ttl: int = Field(300, ge=1)


def _live(r, model: str, stale_s: float) -> list[str]:
    cutoff = time.time() - stale_s
    return [as_str(w) for w in r.zrangebyscore(keys.workers(model), cutoff, "+inf")]


def _stale_entries(r, lane: Lane, min_idle_ms: int, count: int = 1000) -> list[dict]:
    try:
        return r.xpending_range(lane.stream, keys.JOBS_GROUP, min="-", max="+", count=count, idle=min_idle_ms)
    except Exception as e:
        if "nogroup" in str(e).lower() or "no such key" in str(e).lower():
            return []
        raise


def reclaim_stale(r, model: str, s: MaintenanceSettings) -> dict:
    live = _live(r, model, s.worker_stale_seconds)
    moved = removed = 0
    for lane in lanes_of(r, model):
        if live:
            orphaned = [row for row in _stale_entries(r, lane, s.min_idle_ms)
                        if as_str(row["consumer"]) not in live and int(row["times_delivered"]) < s.max_deliveries]
            for i, row in enumerate(orphaned):
                target = live[i % len(live)]
                r.xclaim(lane.stream, keys.JOBS_GROUP, target, s.min_idle_ms, [row["message_id"]],
                         idle=s.min_idle_ms + 1000, justid=True)
                moved += 1
        try:
            consumers = r.xinfo_consumers(lane.stream, keys.JOBS_GROUP)
        except Exception:
            consumers = []
        for c in consumers:
            name = as_str(c["name"])
            if name not in live and int(c.get("pending", 0)) == 0 and int(c.get("idle", 0)) > s.min_idle_ms:
                r.xgroup_delconsumer(lane.stream, keys.JOBS_GROUP, name)
                removed += 1
    return {"moved": moved, "consumers_removed": removed, "live_workers": len(live)}


# The consumer name housekeeping acts under: its state changes are fenced like a worker's.
MAINTENANCE_CONSUMER = "inferq-maintenance"


def dead_letter_exceeded(r, model: str, s: MaintenanceSettings) -> int:
    """Entries delivered max_deliveries times whose worker went silent: claimed
    (only while still idle, so a live owner keeps its job), given a new attempt
    of their own so readers accept the error as final and no stale worker can
    finish it, then error event + dead letter + ack, fenced like a worker's."""
    return sum(_dead_letter_lane(r, lane, s) for lane in lanes_of(r, model))


def _dead_letter_lane(r, lane: Lane, s: MaintenanceSettings) -> int:
    stream = lane.stream
    n = 0
    for row in _stale_entries(r, lane, s.min_idle_ms):
        delivered = int(row["times_delivered"])
        if delivered < s.max_deliveries:
            continue
        eid = as_str(row["message_id"])
        if not r.xclaim(stream, keys.JOBS_GROUP, MAINTENANCE_CONSUMER, s.min_idle_ms, [eid], justid=True):
            continue  # renewed or taken meanwhile: not abandoned after all
        found = r.xrange(stream, eid, eid)
        raw = as_str(job_payload(found[0][1]) or "") if found else ""
        try:
            job_id = json.loads(raw).get("id", "") if raw else ""
        except (ValueError, AttributeError):
            job_id = ""
        if job_id and not transitions.in_partition(stream, job_id):
            job_id = ""  # its keys live on another slot: dead letter only
        attempt = 0
        if job_id:
            attempt, _ = transitions.claim_attempt(r, stream=stream, entry_id=eid, consumer=MAINTENANCE_CONSUMER,
                                                   job_id=job_id, live_ttl=s.live_ttl)
            if attempt < 0:
                continue
        reason = f"delivered {delivered} times without finishing (max_deliveries={s.max_deliveries})"
        error = encode_event(ErrorEvent(attempt=max(attempt, 1), seq=0, code="max_deliveries", message=reason))
        dead = records.DeadLetter(job=raw, job_id=job_id, entry_id=eid, code="max_deliveries", reason=reason,
                                  attempts=delivered, worker=MAINTENANCE_CONSUMER, failed_at=time.time())
        done = transitions.fail(r, stream=stream, dlq=lane.dlq, entry_id=eid, consumer=MAINTENANCE_CONSUMER, attempt=attempt,
                                job_id=job_id or None, error_data=error["data"],
                                fields={**records.info_error("max_deliveries", reason),
                                        "finished_at": repr(time.time())},
                                dead=dead.redacted() if s.dlq_payload == "redact" else dead,
                                dlq_maxlen=s.dlq_maxlen, ttl_after_done=s.reply_ttl, reply_maxlen=s.reply_maxlen,
                                completion=_completion(job_id, raw))
        n += int(done == transitions.DONE)
    return n


def _completion(job_id: str, raw: str) -> dict[str, str]:
    """The webhook record of a job dead-lettered for its deliveries."""
    tenant, route = completion_events.payload_facts(raw)
    return completion_events.job_record(job_id, tenant, records.ERROR, "max_deliveries", route)


def expire_finished_replies(r, s: MaintenanceSettings, scan_count: int = 500) -> int:
    n = 0
    for key in r.scan_iter(match=keys.pattern("reply"), count=scan_count):
        if r.ttl(key) != -1:
            continue  # already expiring (or gone)
        last = r.xrevrange(key, count=1)
        if last and as_str(last[0][1].get(b"type", last[0][1].get("type", ""))) in TERMINAL_TYPES:
            r.expire(key, s.reply_ttl)
            job_id = keys.name_of(as_str(key))
            if job_id and r.ttl(keys.job_info(job_id)) == -1:
                r.expire(keys.job_info(job_id), s.reply_ttl)
            n += 1
    return n


def export_stats(r, s: MaintenanceSettings, models: Optional[list[str]] = None) -> list[dict]:
    out = []
    for st in all_stats(r, s.worker_stale_seconds, models):
        d = st.as_dict()
        flat = {"depth": st.depth, "waiting": st.waiting, "pending": st.pending, "dlq": st.dlq,
                "workers_alive": st.workers_alive, "oldest_waiting_s": st.oldest_waiting_s or 0.0,
                "updated_at": time.time()}
        r.hset(keys.stats(st.model), mapping=flat)
        r.expire(keys.stats(st.model), s.stats_ttl)
        out.append(d)
    return out


def run_all(r, s: Optional[MaintenanceSettings] = None) -> dict:
    s = s or MaintenanceSettings()
    report = {}
    for model in discover_models(r):
        report[model] = {"dead_lettered": dead_letter_exceeded(r, model, s), **reclaim_stale(r, model, s)}
    report["_replies_expired"] = expire_finished_replies(r, s)
    return report
